/* A program built against an installed OrbiTE, as a user of the package would build it. */
#include <orbite/orbite.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    struct orb_engine_config cfg;
    struct orb_epoch epoch, parsed;
    char text[ORB_EPOCH_HEX_LEN + 1];

    if (orb_engine_config_init(&cfg) != ORB_OK ||
        orb_engine_config_load_json(&cfg, "{\"tcp_workers\": 3, \"enable_source\": false}") != ORB_OK) {
        fprintf(stderr, "consumer: configuration failed: %s\n", orb_last_error());
        return 1;
    }
    if (cfg.tcp_workers != 3 || cfg.enable_source != 0) {
        fprintf(stderr, "consumer: JSON values were not applied\n");
        return 1;
    }
    memset(epoch.bytes, 0x5a, sizeof epoch.bytes);
    if (orb_epoch_format(&epoch, text, sizeof text) != ORB_OK || orb_epoch_parse(text, &parsed) != ORB_OK ||
        memcmp(epoch.bytes, parsed.bytes, sizeof epoch.bytes) != 0) {
        fprintf(stderr, "consumer: epoch round trip failed: %s\n", orb_last_error());
        return 1;
    }
    printf("consumer: OrbiTE %d.%d.%d ok (%s)\n", ORB_VERSION_MAJOR, ORB_VERSION_MINOR,
           ORB_VERSION_PATCH, orb_strerror(ORB_OK));
    return 0;
}
