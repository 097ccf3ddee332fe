// The public header compiles as C++11 with -Wall -Wextra -Werror and links with C linkage.
#include <orbite/orbite.h>

#include <cstring>

static_assert(sizeof(orb_epoch) == 16, "an epoch is 128 bits");
static_assert(ORB_NOTIFY_MAX == 4096, "notification payload limit");

namespace {

void sink(orb_log_level level, const char *message, void *ctx)
{
    (void)level;
    (void)message;
    (void)ctx;
}

} // namespace

int main()
{
    orb_engine_config cfg;
    if (orb_engine_config_init(&cfg) != ORB_OK)
        return 1;
    if (orb_engine_config_load_json(&cfg, "{\"tcp_stripes\": 4}") != ORB_OK || cfg.tcp_stripes != 4)
        return 2;
    if (orb_engine_config_load_json(&cfg, "{\"no_such_key\": 1}") != ORB_ECONFIG)
        return 3;
    if (std::strlen(orb_last_error()) == 0)
        return 4; // the failure above names its cause

    orb_epoch epoch;
    std::memset(epoch.bytes, 0xab, sizeof epoch.bytes);
    char text[ORB_EPOCH_HEX_LEN + 1];
    if (orb_epoch_format(&epoch, text, sizeof text) != ORB_OK)
        return 5;
    orb_epoch parsed = {};
    if (orb_epoch_parse(text, &parsed) != ORB_OK ||
        std::memcmp(parsed.bytes, epoch.bytes, sizeof epoch.bytes) != 0)
        return 6;

    orb_log_set_handler(sink, nullptr);
    orb_log_set_handler(nullptr, nullptr);
    return std::strcmp(orb_strerror(ORB_OK), orb_strerror(ORB_EINVAL)) != 0 ? 0 : 7;
}
