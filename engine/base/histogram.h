#ifndef ATC_HISTOGRAM_H
#define ATC_HISTOGRAM_H

/* Prometheus histograms and label escaping: small helpers every subsystem that renders metrics may
 * include (metrics.c, health.c, admission.c, policy/status.c), so none of them includes the metrics page. */

#include <stdint.h>

struct evbuffer;

/* Fixed histogram buckets, in seconds. */
struct atc_histogram {
    const double *bounds;
    unsigned nbounds;
    uint64_t counts[24]; /* per bucket, not cumulative; the last is +Inf */
    uint64_t count;
    double sum;
};

/** Histogram helpers, also for other subsystems' metrics. */
void atc_histogram_init(struct atc_histogram *h, const double *bounds, unsigned nbounds);
void atc_histogram_observe(struct atc_histogram *h, double value);
/** Writes NAME_bucket/_sum/_count lines; @p labels is "" or `key="v",` pairs ending with a comma. */
void atc_histogram_render(const struct atc_histogram *h, struct evbuffer *out, const char *name,
                          const char *labels);

/** Appends @p s to @p out escaped as a Prometheus label value. */
void atc_histogram_label(struct evbuffer *out, const char *s);

#endif
