/* A stand-in for libibverbs.so.1 with the exports the loader requires, as stubs that are never
 * called: what test_rdma_verbs loads to check the loader's every-symbol-or-none rule. Built once
 * whole, once without ibv_reg_mr_iova2 and once with the optional exports too. Exported despite
 * the project-wide -fvisibility=hidden. */
#define STUB(name)                                                                                                   \
    __attribute__((visibility("default"))) void *name(void);                                                        \
    void *name(void)                                                                                                 \
    {                                                                                                                \
        return 0;                                                                                                    \
    }

STUB(ibv_get_device_list)
STUB(ibv_free_device_list)
STUB(ibv_get_device_name)
STUB(ibv_get_device_guid)
STUB(ibv_open_device)
STUB(ibv_close_device)
STUB(ibv_query_device)
STUB(ibv_query_port)
STUB(ibv_query_gid)
STUB(ibv_alloc_pd)
STUB(ibv_dealloc_pd)
#ifndef FAKE_OMIT_REG_MR_IOVA2
STUB(ibv_reg_mr_iova2)
#endif
STUB(ibv_dereg_mr)
STUB(ibv_create_comp_channel)
STUB(ibv_destroy_comp_channel)
STUB(ibv_create_cq)
STUB(ibv_destroy_cq)
STUB(ibv_get_cq_event)
STUB(ibv_ack_cq_events)
STUB(ibv_create_qp)
STUB(ibv_modify_qp)
STUB(ibv_query_qp)
STUB(ibv_destroy_qp)
STUB(ibv_get_async_event)
STUB(ibv_ack_async_event)
STUB(ibv_wc_status_str)
#ifdef FAKE_WITH_OPTIONAL
STUB(ibv_import_device)
STUB(ibv_reg_dmabuf_mr)
STUB(_ibv_query_gid_ex)
#endif
