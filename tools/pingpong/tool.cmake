# orbite-pingpong: the 64-byte TCP round trip that compare-peers.sh sets OrbiTE's small-request
# latency against. A measuring aid, not installed.
add_executable(orbite-pingpong ${CMAKE_CURRENT_LIST_DIR}/pingpong.c)
