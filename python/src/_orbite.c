/* orbite._orbite: the CPython extension under the orbite package (python/orbite/__init__.py).
 *
 * It stays close to the C API and leaves the Pythonic surface (classes, enums, dataclasses,
 * exceptions, asyncio) to the package. Built on CPython's stable ABI (Py_LIMITED_API 3.11, the
 * first release whose stable ABI has the buffer protocol), so one build serves every later
 * CPython. It links liborbite and nothing else; liborbite loads libcuda and libibverbs itself,
 * only when an engine needs them.
 *
 * Rules it keeps:
 *  - The GIL is released around every call that may wait or take long (engine creation and
 *    close, segment open and describe, registration, submissions, batch waits).
 *  - The library never calls into Python. A registered Python buffer (or CUDA array) is held by
 *    a `struct holder`; the library's release callback, which runs on the engine's release
 *    thread, only puts the holder on a pending list under a mutex. The list is drained, with
 *    the GIL, by the next call into this module (and by drain()), which releases the buffer
 *    view or the object reference there.
 *  - Errors are raised as the package's exception classes, one per ORB_E* status, registered
 *    at import by _set_error_classes(); each carries the status and the library's detail text.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <orbite/orbite.h>

/* ---- errors ------------------------------------------------------------------------------------ */

static PyObject *error_classes; /* dict: int status -> exception class (the package's) */
static PyObject *error_base;    /* orbite.Error */

/* Raise the package's class for `status` with `message`; returns NULL. */
static PyObject *raise_status(int status, const char *message)
{
    PyObject *cls = NULL;
    if (error_classes != NULL) {
        PyObject *key = PyLong_FromLong(status);
        if (key == NULL)
            return NULL;
        cls = PyDict_GetItemWithError(error_classes, key); /* borrowed */
        Py_DECREF(key);
        if (cls == NULL && PyErr_Occurred())
            return NULL;
    }
    if (cls == NULL)
        cls = error_base != NULL ? error_base : PyExc_RuntimeError;
    const char *text = message != NULL && message[0] != '\0' ? message : orb_strerror(status);
    PyObject *exc = PyObject_CallFunction(cls, "si", text, status);
    if (exc != NULL) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Raise for a failed library call on this thread (its detail message). */
static PyObject *raise_last(int status)
{
    return raise_status(status, orb_last_error());
}

/* The calling thread's detail message of a failure `rc`, kept before later calls replace it
 * ("" for success). */
#define WHY_LEN 512
static void keep_why(int rc, char why[WHY_LEN])
{
    snprintf(why, WHY_LEN, "%s", rc != 0 ? orb_last_error() : "");
}

static PyObject *raise_invalid(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static PyObject *raise_invalid(const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return raise_status(ORB_EINVAL, text);
}

/* ---- registered Python memory ----------------------------------------------------------------- */

enum holder_kind { HOLD_BUFFER = 1, HOLD_OBJECT = 2 };

/* What keeps a registered Python object alive until the engine lets go of its bytes. Two
 * references: the library's (dropped when the holder is drained after the release) and the
 * Python capsule's (the Registration object's view of it). */
struct holder {
    struct holder *next;    /* pending list */
    atomic_int refs;
    atomic_int released;    /* the engine let go (set by the release callback) */
    enum holder_kind kind;
    Py_buffer view;         /* HOLD_BUFFER */
    PyObject *obj;          /* HOLD_OBJECT: a strong reference */
};

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct holder *pending;     /* pending_lock */
static atomic_int pending_count;

static void holder_put(struct holder *h)
{
    if (atomic_fetch_sub(&h->refs, 1) == 1)
        free(h);
}

/* The library's release callback: any thread, any time, never touches Python. */
static void holder_release(void *ptr, size_t len, void *ctx)
{
    (void)ptr;
    (void)len;
    struct holder *h = ctx;
    /* Pending and counted before it says "released": whoever sees the flag and drains finds
     * it on the list. All under the lock, since a drain may free it as soon as it is popped. */
    pthread_mutex_lock(&pending_lock);
    h->next = pending;
    pending = h;
    atomic_fetch_add(&pending_count, 1);
    atomic_store(&h->released, 1);
    pthread_mutex_unlock(&pending_lock);
}

/* Release what the engines let go of (GIL held). */
static void drain_pending(void)
{
    if (atomic_load(&pending_count) == 0)
        return;
    pthread_mutex_lock(&pending_lock);
    struct holder *list = pending;
    pending = NULL;
    pthread_mutex_unlock(&pending_lock);
    while (list != NULL) {
        struct holder *h = list;
        list = h->next;
        atomic_fetch_sub(&pending_count, 1);
        if (h->kind == HOLD_BUFFER)
            PyBuffer_Release(&h->view);
        else
            Py_XDECREF(h->obj);
        h->obj = NULL;
        holder_put(h);
    }
}

#define HOLDER_CAPSULE "orbite._holder"

static void holder_capsule_free(PyObject *capsule)
{
    struct holder *h = PyCapsule_GetPointer(capsule, HOLDER_CAPSULE);
    if (h != NULL)
        holder_put(h);
    else
        PyErr_Clear();
}

/* A new holder with both references; NULL with MemoryError. */
static struct holder *holder_new(enum holder_kind kind)
{
    struct holder *h = calloc(1, sizeof *h);
    if (h == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    atomic_init(&h->refs, 2);
    atomic_init(&h->released, 0);
    h->kind = kind;
    return h;
}

/* ---- argument helpers ------------------------------------------------------------------------- */

/* A non-negative int that fits uint64_t, or -1 with InvalidArgument/TypeError naming `what`. */
static int to_u64(PyObject *v, const char *what, uint64_t *out)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        raise_invalid("%s is negative or does not fit 64 bits", what);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

/* A small int (enum values), or -1 with TypeError/InvalidArgument naming `what`. */
static int to_enum(PyObject *v, const char *what, int *out)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        raise_invalid("%s is out of range", what);
        return -1;
    }
    if (x < 0 || x > 255) {
        raise_invalid("%s %ld is out of range", what, x);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* A timeout in nanoseconds: an int >= 0, or None for no deadline. */
static int to_timeout(PyObject *v, uint64_t *out)
{
    if (v == Py_None) {
        *out = ORB_TIMEOUT_INFINITE;
        return 0;
    }
    return to_u64(v, "timeout", out);
}

/* Requests from a sequence of tuples (op, local, remote, length[, transport[, priority]]).
 * Returns a malloc'ed array (caller frees) with *n set, or NULL with an exception. An empty
 * sequence gives a non-NULL array with *n 0: the library refuses it by its own rule. */
static struct orb_request *to_requests(PyObject *seq, size_t *n)
{
    if (!PySequence_Check(seq) || PyUnicode_Check(seq) || PyBytes_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "requests must be a sequence of Request tuples");
        return NULL;
    }
    Py_ssize_t count = PySequence_Size(seq);
    if (count < 0)
        return NULL;
    struct orb_request *reqs = calloc(count > 0 ? (size_t)count : 1, sizeof *reqs);
    if (reqs == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (item == NULL)
            goto fail;
        int ok = 0;
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "request %zd is not a Request (a tuple of op, local, remote, length"
                         "[, transport[, priority]])", i);
        } else {
            Py_ssize_t fields = PyTuple_Size(item);
            if (fields < 4 || fields > 6) {
                raise_invalid("request %zd has %zd fields: op, local, remote, length[, transport[, priority]]", i,
                              fields);
            } else {
                char what[64];
                int op = 0, transport = 0, priority = 0;
                struct orb_request *r = &reqs[i];
                snprintf(what, sizeof what, "request %zd: op", i);
                ok = to_enum(PyTuple_GetItem(item, 0), what, &op) == 0;
                snprintf(what, sizeof what, "request %zd: local address", i);
                ok = ok && to_u64(PyTuple_GetItem(item, 1), what, &r->local_addr) == 0;
                snprintf(what, sizeof what, "request %zd: remote address", i);
                ok = ok && to_u64(PyTuple_GetItem(item, 2), what, &r->remote_addr) == 0;
                snprintf(what, sizeof what, "request %zd: length", i);
                ok = ok && to_u64(PyTuple_GetItem(item, 3), what, &r->length) == 0;
                snprintf(what, sizeof what, "request %zd: transport", i);
                ok = ok && (fields < 5 || to_enum(PyTuple_GetItem(item, 4), what, &transport) == 0);
                snprintf(what, sizeof what, "request %zd: priority", i);
                ok = ok && (fields < 6 || to_enum(PyTuple_GetItem(item, 5), what, &priority) == 0);
                r->op = (enum orb_op)op;
                r->transport = (enum orb_transport)transport;
                r->priority = (enum orb_priority)priority;
            }
        }
        Py_DECREF(item);
        if (!ok)
            goto fail;
    }
    *n = (size_t)count;
    return reqs;
fail:
    free(reqs);
    return NULL;
}

/* Notification payload: None, or a bytes-like object (copied by the library during the call). */
struct notify_arg {
    Py_buffer view;
    int held;
    struct orb_notification n;
};

static int to_notify(PyObject *v, struct notify_arg *out)
{
    memset(out, 0, sizeof *out);
    if (v == Py_None)
        return 0;
    if (PyObject_GetBuffer(v, &out->view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "a notification must be bytes-like or None");
        return -1;
    }
    out->held = 1;
    out->n.data = out->view.buf;
    out->n.length = (size_t)out->view.len;
    return 0;
}

static void notify_done(struct notify_arg *a)
{
    if (a->held)
        PyBuffer_Release(&a->view);
    a->held = 0;
}

static PyObject *report_tuple(const struct orb_batch_report *r)
{
    return Py_BuildValue("(iinnKinniiiii)", r->done, r->status, (Py_ssize_t)r->submitted_requests,
                         (Py_ssize_t)r->completed_requests, (unsigned long long)r->completed_bytes, r->has_failure,
                         (Py_ssize_t)r->failure.request_index, (Py_ssize_t)r->failure.affected_requests,
                         r->failure.status, (int)r->failure.remote_effect, (int)r->notification,
                         r->notification_status, r->local_drained);
}

/* (status, report tuple, message) of a batch call. */
static PyObject *outcome(int rc, const struct orb_batch_report *r, const char *message)
{
    PyObject *rep = report_tuple(r);
    if (rep == NULL)
        return NULL;
    PyObject *t = Py_BuildValue("(iNs)", rc, rep, rc != 0 && message != NULL ? message : "");
    return t;
}

/* The end of every dealloc: free the instance and drop its heap type's reference. */
static void instance_free(PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    tp_free(obj);
    Py_DECREF(type);
}

/* ---- HostMemory --------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    orb_host_memory *mem;
    int shared;
} HostMemoryObject;

static PyObject *HostMemoryType;

static PyObject *hostmem_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {(char *)"size", (char *)"align", (char *)"shared", NULL};
    Py_ssize_t size = 0, align = 0;
    int shared = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|np", kwlist, &size, &align, &shared))
        return NULL;
    drain_pending();
    if (size <= 0)
        return raise_invalid("HostMemory: size must be > 0 (got %zd)", size);
    if (align < 0)
        return raise_invalid("HostMemory: align must be >= 0 (got %zd)", align);
    orb_host_memory *mem = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = shared ? orb_host_memory_alloc_shared((size_t)size, (size_t)align, &mem)
                : orb_host_memory_alloc((size_t)size, (size_t)align, &mem);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_last(rc);
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    HostMemoryObject *self = (HostMemoryObject *)alloc(type, 0);
    if (self == NULL) {
        orb_host_memory_unref(mem);
        return NULL;
    }
    self->mem = mem;
    self->shared = shared;
    return (PyObject *)self;
}

static void hostmem_dealloc(PyObject *obj)
{
    HostMemoryObject *self = (HostMemoryObject *)obj;
    orb_host_memory_unref(self->mem); /* registrations hold their own references */
    self->mem = NULL;
    instance_free(obj);
}

static int hostmem_getbuffer(PyObject *obj, Py_buffer *view, int flags)
{
    HostMemoryObject *self = (HostMemoryObject *)obj;
    return PyBuffer_FillInfo(view, obj, orb_host_memory_data(self->mem), (Py_ssize_t)orb_host_memory_size(self->mem),
                             0, flags);
}

static void hostmem_releasebuffer(PyObject *obj, Py_buffer *view)
{
    (void)obj;
    (void)view;
}

static PyObject *hostmem_address(PyObject *obj, void *closure)
{
    (void)closure;
    HostMemoryObject *self = (HostMemoryObject *)obj;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)orb_host_memory_data(self->mem));
}

static PyObject *hostmem_size(PyObject *obj, void *closure)
{
    (void)closure;
    HostMemoryObject *self = (HostMemoryObject *)obj;
    return PyLong_FromSize_t(orb_host_memory_size(self->mem));
}

static PyObject *hostmem_shared(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((HostMemoryObject *)obj)->shared);
}

static Py_ssize_t hostmem_len(PyObject *obj)
{
    return (Py_ssize_t)orb_host_memory_size(((HostMemoryObject *)obj)->mem);
}

static PyGetSetDef hostmem_getset[] = {
    {"address", hostmem_address, NULL, "The address of the first byte.", NULL},
    {"size", hostmem_size, NULL, "The length in bytes.", NULL},
    {"shared", hostmem_shared, NULL, "Whether a same-host peer can be handed these bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot hostmem_slots[] = {
    {Py_tp_new, hostmem_new},
    {Py_tp_dealloc, hostmem_dealloc},
    {Py_tp_getset, hostmem_getset},
    {Py_bf_getbuffer, hostmem_getbuffer},
    {Py_bf_releasebuffer, hostmem_releasebuffer},
    {Py_sq_length, hostmem_len},
    {Py_tp_doc, (void *)"HostMemory(size, align=0, shared=False): zeroed host memory owned by OrbiTE."},
    {0, NULL},
};

static PyType_Spec hostmem_spec = {"orbite._orbite.HostMemory", sizeof(HostMemoryObject), 0,
                                   Py_TPFLAGS_DEFAULT, hostmem_slots};

/* ---- Engine ----------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    orb_engine *engine; /* NULL once closed and freed */
    atomic_int users;   /* calls between engine_enter() and engine_leave() */
} EngineObject;

static PyObject *EngineType, *SegmentType, *BatchType;

/* Enter a call on the engine: it counts as a user, so that close() frees the engine only once
 * no call still holds the pointer (calls release the GIL while they wait). */
static orb_engine *engine_enter(EngineObject *self)
{
    drain_pending();
    orb_engine *e = self->engine;
    if (e == NULL) {
        raise_status(ORB_ECLOSED, "the engine is closed");
        return NULL;
    }
    atomic_fetch_add(&self->users, 1);
    return e;
}

static void engine_leave(EngineObject *self)
{
    atomic_fetch_sub(&self->users, 1);
}

/* A method of the engine: `name`_impl runs between engine_enter() and engine_leave(). */
#define ENGINE_METHOD(name)                                    \
    static PyObject *name(PyObject *obj, PyObject *arg)        \
    {                                                          \
        EngineObject *self = (EngineObject *)obj;              \
        orb_engine *e = engine_enter(self);                    \
        if (e == NULL)                                         \
            return NULL;                                       \
        PyObject *result = name##_impl(e, arg);                \
        engine_leave(self);                                    \
        return result;                                         \
    }

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {(char *)"config", (char *)"rdma", (char *)"metrics", NULL};
    const char *config = NULL, *rdma = NULL, *metrics = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|zzz", kwlist, &config, &rdma, &metrics))
        return NULL;
    drain_pending();
    struct orb_engine_config cfg;
    orb_rdma_config *rcfg = NULL;
    int rc = orb_engine_config_init(&cfg);
    if (rc == 0 && config != NULL)
        rc = orb_engine_config_load_json(&cfg, config);
    if (rc == 0 && rdma != NULL) {
        rc = orb_rdma_config_new(&rcfg);
        if (rc == 0)
            rc = orb_rdma_config_load_json(rcfg, rdma);
    }
    if (rc != 0) {
        raise_last(rc);
        orb_rdma_config_free(rcfg);
        return NULL;
    }
    struct orb_engine_params params = {.field_mask = ORB_ENGINE_PARAM_CONFIG, .config = &cfg};
    if (rcfg != NULL) {
        params.field_mask |= ORB_ENGINE_PARAM_RDMA;
        params.rdma = rcfg;
    }
    if (metrics != NULL) {
        params.field_mask |= ORB_ENGINE_PARAM_METRICS;
        params.metrics_address = metrics;
    }
    orb_engine *e = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_engine_create_params(&params, &e);
    Py_END_ALLOW_THREADS
    orb_rdma_config_free(rcfg);
    if (rc != 0)
        return raise_last(rc);
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    EngineObject *self = (EngineObject *)alloc(type, 0);
    if (self == NULL) {
        Py_BEGIN_ALLOW_THREADS
        orb_engine_free(e);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    self->engine = e;
    atomic_init(&self->users, 0);
    return (PyObject *)self;
}

static void engine_dealloc(PyObject *obj)
{
    EngineObject *self = (EngineObject *)obj;
    orb_engine *e = self->engine;
    self->engine = NULL;
    if (e != NULL) {
        Py_BEGIN_ALLOW_THREADS
        orb_engine_free(e);
        Py_END_ALLOW_THREADS
    }
    drain_pending();
    instance_free(obj);
}

static PyObject *engine_endpoint_impl(orb_engine *e, PyObject *unused)
{
    (void)unused;
    char buf[ORB_ENDPOINT_MAX];
    int rc = orb_engine_endpoint(e, buf, sizeof buf);
    if (rc != 0)
        return raise_last(rc);
    return PyUnicode_FromString(buf);
}

ENGINE_METHOD(engine_endpoint)

static PyObject *epoch_text(const struct orb_epoch *ep)
{
    char buf[ORB_EPOCH_HEX_LEN + 1];
    int rc = orb_epoch_format(ep, buf, sizeof buf);
    if (rc != 0)
        return raise_last(rc);
    return PyUnicode_FromString(buf);
}

static PyObject *engine_epoch_impl(orb_engine *e, PyObject *unused)
{
    (void)unused;
    struct orb_epoch ep;
    int rc = orb_engine_source_epoch(e, &ep);
    if (rc != 0)
        return raise_last(rc);
    return epoch_text(&ep);
}

ENGINE_METHOD(engine_epoch)

/* close(timeout_ns): fence, drain and stop (orb_engine_close), then free the engine once no call
 * of another thread still uses it, which lets every registration go (their Python objects are
 * released as the engine's release thread hands them back). Later calls raise Closed. */
static PyObject *engine_close(PyObject *obj, PyObject *arg)
{
    EngineObject *self = (EngineObject *)obj;
    uint64_t timeout;
    if (to_timeout(arg, &timeout) != 0)
        return NULL;
    if (self->engine == NULL) {
        drain_pending();
        Py_RETURN_NONE; /* closed already */
    }
    orb_engine *e = engine_enter(self);
    if (e == NULL)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_engine_close(e, timeout);
    Py_END_ALLOW_THREADS
    char why[WHY_LEN];
    keep_why(rc, why);
    engine_leave(self);
    if (rc != 0)
        return raise_status(rc, why);
    if (self->engine == e) { /* not freed by another thread's close meanwhile */
        self->engine = NULL; /* from now on no call enters */
        Py_BEGIN_ALLOW_THREADS
        while (atomic_load(&self->users) > 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        orb_engine_free(e);
        Py_END_ALLOW_THREADS
    }
    drain_pending();
    Py_RETURN_NONE;
}

static PyObject *engine_close_direction_impl(orb_engine *e, PyObject *arg)
{
    int source = PyObject_IsTrue(arg);
    if (source < 0)
        return NULL;
    int rc = source ? orb_engine_close_source(e) : orb_engine_close_requester(e);
    if (rc != 0)
        return raise_last(rc);
    Py_RETURN_NONE;
}

ENGINE_METHOD(engine_close_direction)

/* register_buffer(obj, perm) -> (id, address, length, holder): obj's bytes, through the buffer
 * protocol, writable and C-contiguous (the engine may write any registered range: a READ lands
 * in local memory, a peer's WRITE in memory it may write). */
static PyObject *engine_register_buffer_impl(orb_engine *e, PyObject *args)
{
    PyObject *target;
    int perm;
    if (!PyArg_ParseTuple(args, "Oi", &target, &perm))
        return NULL;
    if (!PyObject_CheckBuffer(target)) {
        PyObject *name = PyType_GetName(Py_TYPE(target));
        if (name == NULL)
            return NULL;
        PyErr_Format(PyExc_TypeError, "cannot register a %U: it has neither the buffer protocol nor "
                     "__cuda_array_interface__", name);
        Py_DECREF(name);
        return NULL;
    }
    struct holder *h = holder_new(HOLD_BUFFER);
    if (h == NULL)
        return NULL;
    if (PyObject_GetBuffer(target, &h->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        free(h);
        /* Tell a read-only buffer from a non-contiguous one. */
        Py_buffer ro;
        if (PyObject_GetBuffer(target, &ro, PyBUF_C_CONTIGUOUS) == 0) {
            PyBuffer_Release(&ro);
            return raise_invalid("a read-only buffer cannot be registered: the engine writes registered "
                                 "memory (READs into it, peers' WRITEs)");
        }
        PyErr_Clear();
        return raise_invalid("the buffer is not C-contiguous: register a contiguous array");
    }
    if (h->view.len <= 0) {
        PyBuffer_Release(&h->view);
        free(h);
        return raise_invalid("an empty buffer cannot be registered");
    }
    orb_host_memory *mem = NULL;
    orb_reg_id id = 0;
    int rc = orb_host_memory_wrap(h->view.buf, (size_t)h->view.len, holder_release, h, &mem);
    if (rc != 0) {
        PyObject *err = raise_last(rc);
        PyBuffer_Release(&h->view);
        free(h);
        return err;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = orb_register_host_memory(e, mem, 0, (size_t)h->view.len, (enum orb_perm)perm, &id);
    Py_END_ALLOW_THREADS
    char why[WHY_LEN];
    keep_why(rc, why);
    uint64_t addr = (uint64_t)(uintptr_t)h->view.buf, len = (uint64_t)h->view.len;
    orb_host_memory_unref(mem); /* the registration holds it; on failure this releases h */
    if (rc != 0) {
        holder_put(h); /* the capsule's reference: no capsule was made */
        drain_pending();
        return raise_status(rc, why);
    }
    PyObject *capsule = PyCapsule_New(h, HOLDER_CAPSULE, holder_capsule_free);
    if (capsule == NULL) {
        holder_put(h);
        (void)orb_unregister_memory(e, id);
        return NULL;
    }
    return Py_BuildValue("(KKKN)", (unsigned long long)id, (unsigned long long)addr, (unsigned long long)len,
                         capsule);
}

ENGINE_METHOD(engine_register_buffer)

/* register_memory(HostMemory, offset, length, perm) -> (id, address, length) */
static PyObject *engine_register_memory_impl(orb_engine *e, PyObject *args)
{
    PyObject *target;
    unsigned long long offset, length;
    int perm;
    if (!PyArg_ParseTuple(args, "O!KKi", (PyTypeObject *)HostMemoryType, &target, &offset, &length, &perm))
        return NULL;
    orb_host_memory *mem = ((HostMemoryObject *)target)->mem;
    orb_reg_id id = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_register_host_memory(e, mem, (size_t)offset, (size_t)length, (enum orb_perm)perm, &id);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_last(rc);
    uint64_t addr = (uint64_t)(uintptr_t)orb_host_memory_data(mem) + offset;
    return Py_BuildValue("(KKK)", (unsigned long long)id, (unsigned long long)addr, length);
}

ENGINE_METHOD(engine_register_memory)

/* register_cuda(ptr, length, device, perm, owner) -> (id, address, length, holder): device
 * memory [ptr, +length) of an array whose owner object stays referenced until the engine lets
 * go of the allocation. */
static PyObject *engine_register_cuda_impl(orb_engine *e, PyObject *args)
{
    unsigned long long ptr, length;
    int device, perm;
    PyObject *owner;
    if (!PyArg_ParseTuple(args, "KKiiO", &ptr, &length, &device, &perm, &owner))
        return NULL;
    if (length == 0)
        return raise_invalid("an empty CUDA array cannot be registered");
    struct holder *h = holder_new(HOLD_OBJECT);
    if (h == NULL)
        return NULL;
    Py_INCREF(owner); /* h->obj is set once it is known who releases it */
    orb_cuda_memory *mem = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_cuda_memory_adopt(device, ptr, (size_t)length, holder_release, h, &mem);
    if (rc == ORB_EEXIST) /* the allocation has an owner already, which keeps its first array */
        rc = orb_cuda_memory_adopt(device, ptr, (size_t)length, NULL, NULL, &mem);
    else if (rc == 0)
        h->obj = owner; /* marks that this holder's release comes from the library */
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyObject *err = raise_last(rc);
        Py_DECREF(owner);
        free(h);
        return err;
    }
    if (h->obj == NULL) {
        /* Adopted without a release of its own: the holder's library part is done at once. */
        h->obj = owner;
        holder_release(NULL, 0, h);
    }
    orb_reg_id id = 0;
    uint64_t base = orb_cuda_memory_ptr(mem);
    Py_BEGIN_ALLOW_THREADS
    rc = orb_register_cuda_memory(e, mem, (size_t)(ptr - base), (size_t)length, (enum orb_perm)perm, &id);
    Py_END_ALLOW_THREADS
    char why[WHY_LEN];
    keep_why(rc, why);
    Py_BEGIN_ALLOW_THREADS
    orb_cuda_memory_unref(mem); /* the registration holds it; on failure this may release h */
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        holder_put(h);
        drain_pending();
        return raise_status(rc, why);
    }
    PyObject *capsule = PyCapsule_New(h, HOLDER_CAPSULE, holder_capsule_free);
    if (capsule == NULL) {
        holder_put(h);
        (void)orb_unregister_memory(e, id);
        return NULL;
    }
    return Py_BuildValue("(KKKN)", (unsigned long long)id, ptr, length, capsule);
}

ENGINE_METHOD(engine_register_cuda)

static PyObject *engine_unregister_impl(orb_engine *e, PyObject *arg)
{
    uint64_t id;
    if (to_u64(arg, "registration id", &id) != 0)
        return NULL;
    int rc = orb_unregister_memory(e, id);
    if (rc != 0)
        return raise_last(rc);
    Py_RETURN_NONE;
}

ENGINE_METHOD(engine_unregister)

/* resolve(address, length) -> (id, base, length, perm) */
static PyObject *engine_resolve_impl(orb_engine *e, PyObject *args)
{
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "KK", &addr, &len))
        return NULL;
    struct orb_local_region region;
    int rc = orb_resolve_local_address(e, addr, len, &region);
    if (rc != 0)
        return raise_last(rc);
    return Py_BuildValue("(KKKi)", (unsigned long long)region.id, (unsigned long long)region.base,
                         (unsigned long long)region.length, (int)region.perm);
}

ENGINE_METHOD(engine_resolve)

typedef struct {
    PyObject_HEAD
    orb_segment *segment; /* NULL once closed; valid after the engine is freed (it fails ECLOSED) */
    atomic_int users;     /* calls between segment_enter() and segment_leave() */
} SegmentObject;

/* open_segment(endpoint, epoch, timeout_ns) -> Segment */
static PyObject *engine_open_segment_impl(orb_engine *e, PyObject *args)
{
    const char *endpoint, *epoch_str;
    PyObject *timeout_obj;
    if (!PyArg_ParseTuple(args, "ssO", &endpoint, &epoch_str, &timeout_obj))
        return NULL;
    uint64_t timeout;
    if (to_timeout(timeout_obj, &timeout) != 0)
        return NULL;
    struct orb_epoch ep;
    int rc = orb_epoch_parse(epoch_str, &ep);
    if (rc != 0)
        return raise_last(rc);
    orb_segment *seg = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_open_segment(e, endpoint, &ep, timeout, &seg);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_last(rc);
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)SegmentType, Py_tp_alloc);
    SegmentObject *s = (SegmentObject *)alloc((PyTypeObject *)SegmentType, 0);
    if (s == NULL) {
        orb_segment_close(seg);
        return NULL;
    }
    s->segment = seg;
    atomic_init(&s->users, 0);
    return (PyObject *)s;
}

ENGINE_METHOD(engine_open_segment)

/* Enter a call on a segment (as engine_enter(), so that close() waits for the calls using it). */
static orb_segment *segment_enter(PyObject *o)
{
    if (!PyObject_TypeCheck(o, (PyTypeObject *)SegmentType)) {
        PyErr_SetString(PyExc_TypeError, "expected a Segment");
        return NULL;
    }
    SegmentObject *s = (SegmentObject *)o;
    if (s->segment == NULL) {
        raise_status(ORB_ECLOSED, "the segment is closed");
        return NULL;
    }
    atomic_fetch_add(&s->users, 1);
    return s->segment;
}

static void segment_leave(PyObject *o)
{
    atomic_fetch_sub(&((SegmentObject *)o)->users, 1);
}

/* submit_and_wait(segment, requests, notify, timeout_ns) -> (status, report, message) */
static PyObject *engine_submit_and_wait_impl(orb_engine *e, PyObject *args)
{
    PyObject *seg_obj, *req_obj, *notify_obj, *timeout_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &seg_obj, &req_obj, &notify_obj, &timeout_obj))
        return NULL;
    uint64_t timeout;
    if (to_timeout(timeout_obj, &timeout) != 0)
        return NULL;
    size_t n = 0;
    struct orb_request *reqs = to_requests(req_obj, &n);
    if (reqs == NULL)
        return NULL;
    struct notify_arg na;
    if (to_notify(notify_obj, &na) != 0) {
        free(reqs);
        return NULL;
    }
    orb_segment *seg = segment_enter(seg_obj);
    if (seg == NULL) {
        notify_done(&na);
        free(reqs);
        return NULL;
    }
    struct orb_batch_report rep;
    memset(&rep, 0, sizeof rep);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_submit_and_wait(e, seg, reqs, n, na.held ? &na.n : NULL, timeout, &rep);
    Py_END_ALLOW_THREADS
    segment_leave(seg_obj);
    char why[WHY_LEN];
    keep_why(rc, why);
    notify_done(&na);
    free(reqs);
    drain_pending();
    return outcome(rc, &rep, why);
}

ENGINE_METHOD(engine_submit_and_wait)

typedef struct {
    PyObject_HEAD
    orb_batch *batch;
    PyObject *segment; /* SegmentObject */
    atomic_int busy;   /* a thread is inside a call on it (the C API allows one at a time) */
} BatchObject;

static PyObject *engine_open_batch_impl(orb_engine *e, PyObject *seg_obj)
{
    orb_segment *seg = segment_enter(seg_obj);
    if (seg == NULL)
        return NULL;
    orb_batch *b = NULL;
    int rc = orb_batch_open(e, seg, &b); /* the batch retains the segment */
    segment_leave(seg_obj);
    if (rc != 0)
        return raise_last(rc);
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)BatchType, Py_tp_alloc);
    BatchObject *bo = (BatchObject *)alloc((PyTypeObject *)BatchType, 0);
    if (bo == NULL) {
        orb_batch_free(b);
        return NULL;
    }
    bo->batch = b;
    atomic_init(&bo->busy, 0);
    Py_INCREF(seg_obj);
    bo->segment = seg_obj;
    return (PyObject *)bo;
}

ENGINE_METHOD(engine_open_batch)

/* poll_notifications(max) -> [(sender epoch, bytes)] */
static PyObject *engine_poll_notifications_impl(orb_engine *e, PyObject *arg)
{
    long cap = PyLong_AsLong(arg);
    if (cap == -1 && PyErr_Occurred())
        return NULL;
    if (cap < 1 || cap > 4096)
        return raise_invalid("max must be in 1..4096 (got %ld)", cap);
    struct orb_notification_msg *msgs = calloc((size_t)cap, sizeof *msgs);
    if (msgs == NULL)
        return PyErr_NoMemory();
    size_t count = 0;
    int rc = orb_engine_poll_notifications(e, msgs, (size_t)cap, &count);
    if (rc != 0) {
        free(msgs);
        return raise_last(rc);
    }
    PyObject *list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *sender = epoch_text(&msgs[i].sender);
        PyObject *item = sender == NULL ? NULL
                                        : Py_BuildValue("(Ny#)", sender, (const char *)msgs[i].data,
                                                        (Py_ssize_t)msgs[i].length);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, item);
    }
    free(msgs);
    return list;
}

ENGINE_METHOD(engine_poll_notifications)

/* Set d[key] = unsigned value; 0 or -1. */
static int put_u64(PyObject *d, const char *key, unsigned long long v)
{
    PyObject *x = PyLong_FromUnsignedLongLong(v);
    if (x == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, x);
    Py_DECREF(x);
    return rc;
}

static int put_double(PyObject *d, const char *key, double v)
{
    PyObject *x = PyFloat_FromDouble(v);
    if (x == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, x);
    Py_DECREF(x);
    return rc;
}

static PyObject *engine_rdma_stats_impl(orb_engine *e, PyObject *unused)
{
    (void)unused;
    struct orb_rdma_stats s;
    int rc = orb_engine_rdma_stats(e, &s);
    if (rc != 0)
        return raise_last(rc);
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
#define STAT(f) \
    if (put_u64(d, #f, (unsigned long long)s.f) != 0) \
        goto fail;
    STAT(nics_open) STAT(rails) STAT(helper) STAT(completed_reads) STAT(completed_writes) STAT(payload_send_cqes) STAT(errors)
    STAT(registrations) STAT(memory_regions) STAT(registered_bytes) STAT(kept_memory_regions)
    STAT(requests_in_flight) STAT(grants_active) STAT(grants_served) STAT(staging_bytes) STAT(staged_transfers)
    STAT(slot_deferrals) STAT(deadline_drops) STAT(reconnects) STAT(connections) STAT(source_connections)
    STAT(rail_errors) STAT(rail_open_pairs) STAT(rail_probes) STAT(rail_recoveries) STAT(monitor_ticks)
    STAT(route_queries) STAT(route_recoveries) STAT(routes_down) STAT(kept_queue_pairs) STAT(read_replays)
    STAT(progress_recoveries) STAT(dmabuf_registrations) STAT(peermem_registrations) STAT(staged_slots)
    STAT(private_grants) STAT(reuse_grants) STAT(reuse_probe_failures) STAT(kept_keys)
    STAT(own_connection_grants)
    STAT(grant_round_trips)
    STAT(ack_messages)
#undef STAT
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

ENGINE_METHOD(engine_rdma_stats)

static PyObject *engine_rdma_nic_load_impl(orb_engine *e, PyObject *unused)
{
    (void)unused;
    size_t count = 0;
    int rc = orb_engine_rdma_nic_load(e, NULL, 0, &count);
    if (rc != 0)
        return raise_last(rc);
    struct orb_rdma_nic_load *loads = calloc(count > 0 ? count : 1, sizeof *loads);
    if (loads == NULL)
        return PyErr_NoMemory();
    rc = orb_engine_rdma_nic_load(e, loads, count, &count);
    if (rc != 0) {
        free(loads);
        return raise_last(rc);
    }
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < count; i++) {
        const struct orb_rdma_nic_load *l = &loads[i];
        PyObject *d = PyDict_New();
        PyObject *name = d != NULL ? PyUnicode_FromString(l->name) : NULL;
        int bad = d == NULL || name == NULL || PyDict_SetItemString(d, "name", name) != 0;
        Py_XDECREF(name);
#define NIC(f) bad = bad || put_u64(d, #f, (unsigned long long)l->f) != 0;
        NIC(rail) NIC(port) NIC(healthy) NIC(link_mbps) NIC(effective_mbps) NIC(charged_bytes) NIC(posted_bytes)
        NIC(completed_bytes) NIC(allocated_bytes) NIC(rail_errors) NIC(rail_probes) NIC(rail_open_pairs)
        NIC(port_active)
#undef NIC
        bad = bad || put_double(d, "selection_bps", l->selection_bps) != 0 ||
              put_double(d, "transmit_bps", l->transmit_bps) != 0 || PyList_Append(list, d) != 0;
        Py_XDECREF(d);
        if (bad)
            Py_CLEAR(list);
    }
    free(loads);
    return list;
}

ENGINE_METHOD(engine_rdma_nic_load)

static PyObject *engine_metrics_address_impl(orb_engine *e, PyObject *unused)
{
    (void)unused;
    char buf[ORB_ENDPOINT_MAX];
    int rc = orb_engine_metrics_address(e, buf, sizeof buf);
    if (rc != 0)
        return raise_last(rc);
    return PyUnicode_FromString(buf);
}

ENGINE_METHOD(engine_metrics_address)

/* metrics_json() -> str: orb_engine_metrics_json(), sized by a first call (retried if the counters
 * grew the text meanwhile). */
static PyObject *engine_metrics_json_impl(orb_engine *e, PyObject *unused)
{
    (void)unused;
    for (int tries = 0; tries < 4; tries++) {
        size_t need = 0;
        int rc = orb_engine_metrics_json(e, NULL, 0, &need);
        if (rc != 0)
            return raise_last(rc);
        size_t cap = need + 256;
        char *buf = malloc(cap);
        if (buf == NULL)
            return PyErr_NoMemory();
        rc = orb_engine_metrics_json(e, buf, cap, &need);
        if (rc == 0) {
            PyObject *text = PyUnicode_FromString(buf);
            free(buf);
            return text;
        }
        free(buf);
        if (rc != ORB_EINVAL || need <= cap)
            return raise_last(rc);
    }
    return raise_status(ORB_EAGAIN, "the metrics kept growing while they were copied");
}

ENGINE_METHOD(engine_metrics_json)

static PyMethodDef engine_methods[] = {
    {"endpoint", engine_endpoint, METH_NOARGS, NULL},
    {"epoch", engine_epoch, METH_NOARGS, NULL},
    {"close", engine_close, METH_O, NULL},
    {"close_direction", engine_close_direction, METH_O, NULL},
    {"register_buffer", engine_register_buffer, METH_VARARGS, NULL},
    {"register_memory", engine_register_memory, METH_VARARGS, NULL},
    {"register_cuda", engine_register_cuda, METH_VARARGS, NULL},
    {"unregister", engine_unregister, METH_O, NULL},
    {"resolve", engine_resolve, METH_VARARGS, NULL},
    {"open_segment", engine_open_segment, METH_VARARGS, NULL},
    {"submit_and_wait", engine_submit_and_wait, METH_VARARGS, NULL},
    {"open_batch", engine_open_batch, METH_O, NULL},
    {"poll_notifications", engine_poll_notifications, METH_O, NULL},
    {"rdma_stats", engine_rdma_stats, METH_NOARGS, NULL},
    {"rdma_nic_load", engine_rdma_nic_load, METH_NOARGS, NULL},
    {"metrics_json", engine_metrics_json, METH_NOARGS, NULL},
    {"metrics_address", engine_metrics_address, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_new, engine_new},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_methods, engine_methods},
    {Py_tp_doc, (void *)"The C engine handle (use orbite.Engine)."},
    {0, NULL},
};

static PyType_Spec engine_spec = {"orbite._orbite.Engine", sizeof(EngineObject), 0, Py_TPFLAGS_DEFAULT,
                                  engine_slots};

/* ---- Segment ---------------------------------------------------------------------------------- */

static void segment_dealloc(PyObject *obj)
{
    SegmentObject *self = (SegmentObject *)obj;
    if (self->segment != NULL) {
        orb_segment *seg = self->segment;
        self->segment = NULL;
        Py_BEGIN_ALLOW_THREADS
        orb_segment_close(seg);
        Py_END_ALLOW_THREADS
    }
    instance_free(obj);
}

static PyObject *segment_close(PyObject *obj, PyObject *unused)
{
    (void)unused;
    SegmentObject *self = (SegmentObject *)obj;
    orb_segment *seg = self->segment;
    self->segment = NULL; /* no call enters from now on */
    if (seg != NULL) {
        Py_BEGIN_ALLOW_THREADS
        while (atomic_load(&self->users) > 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        orb_segment_close(seg);
        Py_END_ALLOW_THREADS
    }
    drain_pending();
    Py_RETURN_NONE;
}

/* describe(timeout_ns) -> [(address, length, perm, memory kind, gpu direct routes)] */
static PyObject *segment_describe(PyObject *obj, PyObject *arg)
{
    drain_pending();
    uint64_t timeout;
    if (to_timeout(arg, &timeout) != 0)
        return NULL;
    orb_segment *seg = segment_enter(obj);
    if (seg == NULL)
        return NULL;
    struct orb_region_desc *descs = NULL;
    size_t count = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_segment_describe(seg, timeout, &descs, &count);
    Py_END_ALLOW_THREADS
    segment_leave(obj);
    if (rc != 0)
        return raise_last(rc);
    PyObject *list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list != NULL && i < count; i++) {
        const struct orb_region_desc *d = &descs[i];
        PyObject *item = Py_BuildValue("(KKiII)", (unsigned long long)d->addr, (unsigned long long)d->length,
                                       (int)d->perm, (unsigned int)d->memory_kind, (unsigned int)d->gpu_direct_routes);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, item);
    }
    orb_region_descs_free(descs);
    return list;
}

static PyMethodDef segment_methods[] = {
    {"close", segment_close, METH_NOARGS, NULL},
    {"describe", segment_describe, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot segment_slots[] = {
    {Py_tp_dealloc, segment_dealloc},
    {Py_tp_methods, segment_methods},
    {Py_tp_doc, (void *)"The C segment handle (use orbite.Segment)."},
    {0, NULL},
};

static PyType_Spec segment_spec = {"orbite._orbite.Segment", sizeof(SegmentObject), 0,
                                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, segment_slots};

/* ---- Batch ------------------------------------------------------------------------------------ */

/* Enter a call on the batch: one thread at a time, as the C API requires. */
static orb_batch *batch_enter(BatchObject *self)
{
    drain_pending();
    if (self->batch == NULL) {
        raise_status(ORB_ECLOSED, "the batch was freed");
        return NULL;
    }
    int expected = 0;
    if (!atomic_compare_exchange_strong(&self->busy, &expected, 1)) {
        raise_status(ORB_EBUSY, "another thread is using this batch");
        return NULL;
    }
    return self->batch;
}

static void batch_leave(BatchObject *self)
{
    atomic_store(&self->busy, 0);
    drain_pending();
}

static void batch_dealloc(PyObject *obj)
{
    BatchObject *self = (BatchObject *)obj;
    if (self->batch != NULL) {
        /* The library never frees live work: a batch dropped while it runs is sealed and waited
         * for first (it ends, at the latest, at the engine's io_timeout_s or close). */
        orb_batch *b = self->batch;
        self->batch = NULL;
        Py_BEGIN_ALLOW_THREADS
        if (orb_batch_free(b) == ORB_EBUSY) {
            struct orb_batch_report rep;
            (void)orb_batch_seal(b, NULL);
            (void)orb_batch_wait(b, ORB_TIMEOUT_INFINITE, &rep);
            (void)orb_batch_free(b);
        }
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->segment);
    instance_free(obj);
}

static PyObject *batch_submit(PyObject *obj, PyObject *req_obj)
{
    BatchObject *self = (BatchObject *)obj;
    size_t n = 0;
    struct orb_request *reqs = to_requests(req_obj, &n);
    if (reqs == NULL)
        return NULL;
    orb_batch *b = batch_enter(self);
    if (b == NULL) {
        free(reqs);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_batch_submit(b, reqs, n);
    Py_END_ALLOW_THREADS
    char why[WHY_LEN];
    keep_why(rc, why);
    free(reqs);
    batch_leave(self);
    if (rc != 0)
        return raise_status(rc, why);
    Py_RETURN_NONE;
}

static PyObject *batch_seal(PyObject *obj, PyObject *notify_obj)
{
    BatchObject *self = (BatchObject *)obj;
    struct notify_arg na;
    if (to_notify(notify_obj, &na) != 0)
        return NULL;
    orb_batch *b = batch_enter(self);
    if (b == NULL) {
        notify_done(&na);
        return NULL;
    }
    int rc = orb_batch_seal(b, na.held ? &na.n : NULL);
    char why[WHY_LEN];
    keep_why(rc, why);
    notify_done(&na);
    batch_leave(self);
    if (rc != 0)
        return raise_status(rc, why);
    Py_RETURN_NONE;
}

static PyObject *batch_poll(PyObject *obj, PyObject *unused)
{
    (void)unused;
    BatchObject *self = (BatchObject *)obj;
    orb_batch *b = batch_enter(self);
    if (b == NULL)
        return NULL;
    struct orb_batch_report rep;
    memset(&rep, 0, sizeof rep);
    int rc = orb_batch_poll(b, &rep);
    char why[WHY_LEN];
    keep_why(rc == ORB_EAGAIN ? 0 : rc, why);
    batch_leave(self);
    return outcome(rc, &rep, why);
}

static PyObject *batch_wait(PyObject *obj, PyObject *arg)
{
    BatchObject *self = (BatchObject *)obj;
    uint64_t timeout;
    if (to_timeout(arg, &timeout) != 0)
        return NULL;
    orb_batch *b = batch_enter(self);
    if (b == NULL)
        return NULL;
    struct orb_batch_report rep;
    memset(&rep, 0, sizeof rep);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_batch_wait(b, timeout, &rep);
    Py_END_ALLOW_THREADS
    char why[WHY_LEN];
    keep_why(rc, why);
    batch_leave(self);
    return outcome(rc, &rep, why);
}

static PyObject *batch_free(PyObject *obj, PyObject *unused)
{
    (void)unused;
    BatchObject *self = (BatchObject *)obj;
    orb_batch *b = batch_enter(self);
    if (b == NULL) {
        if (self->batch == NULL) { /* freed already: nothing to do */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = orb_batch_free(b);
    Py_END_ALLOW_THREADS
    char why[WHY_LEN];
    keep_why(rc, why);
    if (rc == 0)
        self->batch = NULL;
    batch_leave(self);
    if (rc != 0)
        return raise_status(rc, why);
    Py_RETURN_NONE;
}

static PyMethodDef batch_methods[] = {
    {"submit", batch_submit, METH_O, NULL},
    {"seal", batch_seal, METH_O, NULL},
    {"poll", batch_poll, METH_NOARGS, NULL},
    {"wait", batch_wait, METH_O, NULL},
    {"free", batch_free, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_methods, batch_methods},
    {Py_tp_doc, (void *)"The C batch handle (use orbite.Batch)."},
    {0, NULL},
};

static PyType_Spec batch_spec = {"orbite._orbite.Batch", sizeof(BatchObject), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, batch_slots};

/* ---- module functions ------------------------------------------------------------------------- */

static PyObject *mod_set_error_classes(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *classes, *base;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &classes, &base))
        return NULL;
    PyObject *old_classes = error_classes, *old_base = error_base;
    Py_INCREF(classes);
    error_classes = classes;
    Py_INCREF(base);
    error_base = base;
    Py_XDECREF(old_classes);
    Py_XDECREF(old_base);
    Py_RETURN_NONE;
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long status = PyLong_AsLong(arg);
    if (status == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(orb_strerror((int)status));
}

static PyObject *mod_drain(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    drain_pending();
    Py_RETURN_NONE;
}

static PyObject *mod_released(PyObject *mod, PyObject *capsule)
{
    (void)mod;
    struct holder *h = PyCapsule_GetPointer(capsule, HOLDER_CAPSULE);
    if (h == NULL)
        return NULL;
    drain_pending();
    return PyBool_FromLong(atomic_load(&h->released));
}

static PyObject *mod_set_log_level(PyObject *mod, PyObject *arg)
{
    (void)mod;
    int level;
    if (to_enum(arg, "log level", &level) != 0)
        return NULL;
    if (level > ORB_LOG_TRACE)
        return raise_invalid("log level %d is not 0 (error) .. 4 (trace)", level);
    orb_log_set_level((enum orb_log_level)level);
    Py_RETURN_NONE;
}

static PyObject *mod_get_log_level(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyLong_FromLong((long)orb_log_get_level());
}

static PyObject *mod_cuda_retained(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    struct orb_cuda_retained r;
    int rc = orb_cuda_retained_resources(&r);
    if (rc != 0)
        return raise_last(rc);
    return Py_BuildValue("{sKsKsKsKsKsK}", "device_allocations", (unsigned long long)r.device_allocations,
                         "device_bytes", (unsigned long long)r.device_bytes, "host_allocations",
                         (unsigned long long)r.host_allocations, "host_bytes", (unsigned long long)r.host_bytes,
                         "contexts", (unsigned long long)r.contexts, "imports", (unsigned long long)r.imports);
}

static PyMethodDef module_methods[] = {
    {"_set_error_classes", mod_set_error_classes, METH_VARARGS, NULL},
    {"strerror", mod_strerror, METH_O, "The library's text for a status code."},
    {"drain", mod_drain, METH_NOARGS, "Release the Python objects the engines let go of."},
    {"released", mod_released, METH_O, NULL},
    {"set_log_level", mod_set_log_level, METH_O, NULL},
    {"get_log_level", mod_get_log_level, METH_NOARGS, NULL},
    {"cuda_retained", mod_cuda_retained, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "orbite._orbite", "The C side of the orbite package.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

static int add_type(PyObject *mod, PyType_Spec *spec, const char *name, PyObject **out)
{
    PyObject *type = PyType_FromSpec(spec);
    if (type == NULL)
        return -1;
    if (PyModule_AddObjectRef(mod, name, type) != 0) {
        Py_DECREF(type);
        return -1;
    }
    *out = type; /* the module's reference keeps it; this one is the module's own use */
    return 0;
}

PyMODINIT_FUNC PyInit__orbite(void);
PyMODINIT_FUNC PyInit__orbite(void)
{
    PyObject *mod = PyModule_Create(&module_def);
    if (mod == NULL)
        return NULL;
    if (add_type(mod, &hostmem_spec, "HostMemory", &HostMemoryType) != 0 ||
        add_type(mod, &engine_spec, "Engine", &EngineType) != 0 ||
        add_type(mod, &segment_spec, "Segment", &SegmentType) != 0 ||
        add_type(mod, &batch_spec, "Batch", &BatchType) != 0 ||
        PyModule_AddIntConstant(mod, "VERSION_MAJOR", ORB_VERSION_MAJOR) != 0 ||
        PyModule_AddIntConstant(mod, "VERSION_MINOR", ORB_VERSION_MINOR) != 0 ||
        PyModule_AddIntConstant(mod, "VERSION_PATCH", ORB_VERSION_PATCH) != 0 ||
        PyModule_AddIntConstant(mod, "NOTIFY_MAX", ORB_NOTIFY_MAX) != 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
