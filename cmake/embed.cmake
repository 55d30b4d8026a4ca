# Turns a file into a C array at build time: cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake.
# Defines `const unsigned char NAME[]` and `const size_t NAME_len` (no NUL added: the length says where it
# ends). The source stays an ordinary file that editors and linters read; the binary needs nothing beside it.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR len "${nhex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x..," 16 row)
string(REGEX REPLACE "(${row})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by cmake/embed.cmake: edit that file instead. */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {\n${bytes}\n};\n"
  "const size_t ${NAME}_len = ${len};\n")
# Only a changed file is rewritten, so an unchanged page does not rebuild what depends on it.
configure_file("${OUT}.tmp" "${OUT}" COPYONLY)
file(REMOVE "${OUT}.tmp")
