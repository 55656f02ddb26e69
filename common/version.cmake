# Writes the version header (OUT) that common/version.cpp includes: the project's version and the
# commit of the source tree, found at every build (not only when cmake runs). The file changes only
# when its text does, so a build at the same commit recompiles nothing.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown commit")
endif()
set(text "#define DMHNSW_VERSION \"${VERSION}\"\n#define DMHNSW_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
