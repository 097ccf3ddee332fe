# Man pages from the Markdown pages of docs/man (pandoc, a Debian package): orb_*.md become
# section 3, NAME.N.md section N (the tools: 1, and 8 for the administrator's). Built with the
# default target and installed under <mandir>/manN (component orbite_documentation). Without
# pandoc the build goes on and says which pages it skipped.
file(GLOB ORB_MAN_SOURCES ${PROJECT_SOURCE_DIR}/docs/man/orb_*.md ${PROJECT_SOURCE_DIR}/docs/man/*.[18].md)
list(SORT ORB_MAN_SOURCES)
find_program(ORB_PANDOC pandoc)
if(NOT ORB_PANDOC)
  set(skipped "")
  foreach(src ${ORB_MAN_SOURCES})
    get_filename_component(n ${src} NAME)
    list(APPEND skipped ${n})
  endforeach()
  list(LENGTH skipped count)
  list(JOIN skipped " " skipped)
  message(STATUS "orbite: pandoc not found: ${count} man pages skipped (docs/man: ${skipped})")
  set(ORB_MAN_BUILT OFF)
  return()
endif()

set(ORB_MAN_BUILT ON)
set(ORB_MAN_DIR ${PROJECT_BINARY_DIR}/man)
set(ORB_MAN_PAGES "")
foreach(src ${ORB_MAN_SOURCES})
  get_filename_component(file ${src} NAME)
  string(REGEX REPLACE "\\.md$" "" base ${file})
  if(base MATCHES "^(.+)\\.([18])$")
    set(name ${CMAKE_MATCH_1})
    set(section ${CMAKE_MATCH_2})
  else()
    set(name ${base})
    set(section 3)
  endif()
  set(out ${ORB_MAN_DIR}/man${section}/${name}.${section})
  add_custom_command(OUTPUT ${out}
                     COMMAND ${CMAKE_COMMAND} -E make_directory ${ORB_MAN_DIR}/man${section}
                     COMMAND ${ORB_PANDOC} --standalone --from markdown --to man --shift-heading-level-by=-1
                             --metadata title=${name} --metadata section=${section}
                             "--metadata=header:OrbiTE Manual" "--metadata=footer:orbite ${PROJECT_VERSION}"
                             --output ${out} ${src}
                     DEPENDS ${src} VERBATIM)
  list(APPEND ORB_MAN_PAGES ${out})
endforeach()
add_custom_target(orbite_man ALL DEPENDS ${ORB_MAN_PAGES})
install(DIRECTORY ${ORB_MAN_DIR}/ DESTINATION ${CMAKE_INSTALL_MANDIR} COMPONENT orbite_documentation)

if(ORBITE_BUILD_TESTS)
  add_test(NAME api_man_pages COMMAND sh ${PROJECT_SOURCE_DIR}/tests/api/check_man.sh ${PROJECT_SOURCE_DIR}
                                         ${PROJECT_BINARY_DIR})
  set_tests_properties(api_man_pages PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
