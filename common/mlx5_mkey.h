/* The mlx5 memory key context (mkc) as the device's commands lay it out (PRM), shared by the
 * library, which builds CREATE_MKEY for a grant key (lib/rdma/devx_key.c), and the helper, which
 * reads QUERY_MKEY's answer back to check it (helper/devx.c). Both commands carry the context at
 * the same offset and the KLM entries after it at the same offset. Fields are big-endian. */
#ifndef ORB_COMMON_MLX5_MKEY_H
#define ORB_COMMON_MLX5_MKEY_H

#include <stdint.h>

/* Where the context and the KLM entries sit in CREATE_MKEY's input and QUERY_MKEY's output. */
#define ORB_MKEY_CMD_MKC_OFFSET 16u
#define ORB_MKEY_CMD_KLM_OFFSET 272u
#define ORB_MKEY_KLM_SIZE 16u       /* u32 byte_count, u32 mkey, u64 address */

/* Byte offsets within the context, and the bits used. */
#define ORB_MKC_FLAGS0 0u           /* free 0x40, access_mode_4_2 0x1c */
#define ORB_MKC_FLAGS2 2u           /* umr_en 0x80, a 0x40, rw 0x20, rr 0x10, lw 0x08, lr 0x04, access_mode_1_0 0x03 */
#define ORB_MKC_QPN 4u              /* qpn (24 bits) then mkey_7_0 */
#define ORB_MKC_FLAGS12 12u         /* length64 0x80, bsf_en 0x40, en_rinval 0x01; then the 24-bit pd */
#define ORB_MKC_START_ADDR 16u
#define ORB_MKC_LEN 24u
#define ORB_MKC_TRANSLATIONS 52u
#define ORB_MKC_RW 0x20u
#define ORB_MKC_RR 0x10u
#define ORB_MKC_LW 0x08u
#define ORB_MKC_LR 0x04u
#define ORB_MKC_EN_RINVAL 0x01u
#define ORB_MKC_ACCESS_MODE_KLMS 2u
#define ORB_MKC_QPN_WILDCARD 0xFFFFFFu

static inline uint32_t orb_be32_get(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint64_t orb_be64_get(const uint8_t *p)
{
    return (uint64_t)orb_be32_get(p) << 32 | orb_be32_get(p + 4);
}

static inline void orb_be32_put(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void orb_be64_put(uint8_t *p, uint64_t v)
{
    orb_be32_put(p, (uint32_t)(v >> 32));
    orb_be32_put(p + 4, (uint32_t)v);
}

#endif
