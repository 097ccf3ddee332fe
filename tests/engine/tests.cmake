# Engines in one process over loopback, through the public API of the shared library: request
# authority, batch reports under pipelining, admission and contracts.
set(ORB_ENGINE_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
function(orb_engine_test name)
  add_executable(${name} ${ORB_ENGINE_TEST_DIR}/${name}.c ${ORB_ENGINE_TEST_DIR}/util.c)
  target_include_directories(${name} PRIVATE ${ORB_ENGINE_TEST_DIR})
  target_link_libraries(${name} PRIVATE orbite PkgConfig::CMOCKA Threads::Threads)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300)
endfunction()

orb_engine_test(test_authority)
orb_engine_test(test_reports)
orb_engine_test(test_contracts)
orb_engine_test(test_admission)
# Idle engines: a same-host connection with nothing to do sleeps, and wakes for the next request.
orb_engine_test(test_idle)

# The suites that apply to every transport, again on the same-host transport.
foreach(t test_authority test_reports test_contracts)
  add_test(NAME ${t}_shm COMMAND ${t})
  set_tests_properties(${t}_shm PROPERTIES TIMEOUT 300 ENVIRONMENT ORB_TEST_TRANSPORT=shm)
endforeach()

# The metrics snapshot and its JSON form; its last cell times transfers, so it runs alone.
orb_engine_test(test_metrics)
target_link_libraries(test_metrics PRIVATE PkgConfig::JANSSON)
set_tests_properties(test_metrics PROPERTIES RUN_SERIAL TRUE)

# The Prometheus exporter over HTTP; static, for the hook that names the library to load.
add_executable(test_metrics_http ${ORB_ENGINE_TEST_DIR}/test_metrics_http.c ${ORB_ENGINE_TEST_DIR}/util.c)
target_include_directories(test_metrics_http PRIVATE ${ORB_ENGINE_TEST_DIR} ${PROJECT_SOURCE_DIR}/lib)
target_link_libraries(test_metrics_http PRIVATE orbite_static PkgConfig::CMOCKA Threads::Threads)
add_test(NAME test_metrics_http COMMAND test_metrics_http)
set_tests_properties(test_metrics_http PROPERTIES TIMEOUT 120)
