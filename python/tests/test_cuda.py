"""CUDA arrays through __cuda_array_interface__, on the CPU stand-in of libcuda.so.1
(tests/fakecuda). The checks run in a child process whose library path puts the stand-in first,
the way a CUDA host's driver is found; ORBITE_FAKECUDA_DIR (set by ctest) names its folder."""

import ctypes
import gc
import os
import subprocess
import sys
import weakref

import pytest

FAKECUDA = os.environ.get("ORBITE_FAKECUDA_DIR")


@pytest.mark.skipif(not FAKECUDA, reason="ORBITE_FAKECUDA_DIR is not set (ctest sets it)")
def test_cuda_arrays_on_the_stand_in():
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = FAKECUDA + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    run = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cuda checks passed" in run.stdout


class Driver:
    """The few driver calls a test needs, through ctypes (the stand-in here, the real driver on a GPU)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError("%s failed: %d" % (what, rc))

    def alloc(self, n):
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)), "cuMemAlloc_v2")
        return ptr.value

    def free(self, ptr):
        self.check(self.lib.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree_v2")

    def put(self, ptr, data):
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self.check(self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), buf, ctypes.c_size_t(len(data))), "HtoD")

    def get(self, ptr, n):
        buf = ctypes.create_string_buffer(n)
        self.check(self.lib.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr), ctypes.c_size_t(n)), "DtoH")
        return buf.raw


class Tensor:
    """A stand-in for a torch or cupy tensor: device bytes it frees when it goes, described by
    __cuda_array_interface__ (version 3) and __dlpack_device__."""

    def __init__(self, driver, n, readonly=False, strides=None, owns=True):
        self.driver = driver
        self.ptr = driver.alloc(n) if owns else None
        self.n = n
        self.readonly = readonly
        self.strides = strides

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n // 4,), "typestr": "<f4", "data": (self.ptr, self.readonly),
                "strides": self.strides, "version": 3}

    def __dlpack_device__(self):
        return (2, 0)

    def __del__(self):
        if self.ptr is not None:
            self.driver.free(self.ptr)


class View:
    """A second array over part of another's allocation (as a slice of a tensor is)."""

    def __init__(self, base, offset, n):
        self.base, self.offset, self.n = base, offset, n

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": "|u1", "data": (self.base.ptr + self.offset, False), "version": 3}


def main():
    import orbite
    from orbite import Perm, Request

    drv = Driver()
    n = 4 << 20
    data = bytes((i * 7 + 3) & 0xFF for i in range(256)) * (n // 256)
    with orbite.Engine() as source, orbite.Engine({"enable_source": False}) as req:
        t = Tensor(drv, n)
        drv.put(t.ptr, data)
        reg = source.register(t, Perm.REMOTE_WRITE)
        assert reg.kind == orbite.MemoryKind.CUDA and reg.address == t.ptr and reg.length == n
        ptr = t.ptr
        watch = weakref.ref(t)
        del t
        gc.collect()
        assert watch() is not None, "the registration must keep the tensor"
        local = bytearray(n)
        lr = req.register(local)
        with req.open_segment(source.endpoint, source.epoch) as seg:
            regions = seg.describe()
            assert regions[0].memory_kind == orbite.MemoryKind.CUDA, regions
            # Device -> host (the source stages it), then host -> device.
            req.submit_and_wait(seg, [Request.read(lr.address, ptr, n)], timeout=60)
            assert bytes(local) == data
            local[:] = bytes(reversed(local))
            req.submit_and_wait(seg, [Request.write(lr.address, ptr, n)], timeout=60)
            assert drv.get(ptr, n) == bytes(local)
            # A view of the same allocation registers on the allocation's one owner.
            v = View(watch(), 4096, 8192)
            vreg = source.register(v, Perm.REMOTE_READ)
            assert vreg.address == ptr + 4096 and vreg.length == 8192
            req.submit_and_wait(seg, [Request.read(lr.address, ptr + 4096, 8192)], timeout=60)
            vreg.unregister()
            del v, vreg
        # Device memory on the requester side, too.
        dev_local = Tensor(drv, 1 << 20)
        dreg = req.register(dev_local)
        assert dreg.kind == orbite.MemoryKind.CUDA

        # What cannot be registered safely is refused, by name.
        for bad, why in ((Tensor(drv, 4096, readonly=True), "read-only"),
                         (Tensor(drv, 4096, strides=(8,)), "contiguous")):
            try:
                source.register(bad)
            except orbite.InvalidArgument as e:
                assert why in str(e), e
            else:
                raise AssertionError("registered a %s array" % why)
        for bad_cai in ({"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3},
                        {"shape": (4,), "typestr": "?", "data": (ptr, False), "version": 3},
                        {"shape": "4", "typestr": "<f4", "data": (ptr, False), "version": 3},
                        {"shape": (4,), "typestr": "<f4", "data": "nowhere", "version": 3}):
            obj = type("Odd", (), {"__cuda_array_interface__": bad_cai})()
            try:
                source.register(obj)
            except orbite.InvalidArgument:
                pass
            else:
                raise AssertionError("registered %r" % (bad_cai,))
        host = bytearray(4096)
        hobj = type("HostPointer", (), {"__cuda_array_interface__": {
            "shape": (4096,), "typestr": "|u1", "data": (ctypes.addressof(ctypes.c_char.from_buffer(host)), False),
            "version": 3}})()
        try:
            source.register(hobj)
        except orbite.InvalidArgument:
            pass  # host memory is not device memory
        else:
            raise AssertionError("registered host memory as a CUDA array")
        try:
            source.register(Tensor(drv, 4096), device=7)
        except orbite.Error:
            pass  # no such device
        else:
            raise AssertionError("registered on device 7")

        reg.unregister()
        assert reg.wait_released(10.0)
        gc.collect()
        assert watch() is None, "the tensor must go once the engine let go of it"
        dreg.unregister()
        assert dreg.wait_released(10.0)
    print("cuda checks passed")


if __name__ == "__main__":
    main()
