"""Build of the orbite package's extension against an installed liborbite.

Where liborbite is found, first match wins:
  ORBITE_PREFIX      the prefix it was installed into (cmake --install ... --prefix DIR);
  pkg-config orbite  (PKG_CONFIG_PATH as usual);
  /usr/local, then /usr.
The extension links liborbite only (CUDA and verbs stay loaded at run time by the library) and
records the library's folder as its run path, so an install outside the linker's folders works.
It is built on CPython's stable ABI (3.11 and later: one wheel, tag abi3).
"""

import os
import shlex
import subprocess

from setuptools import Extension, setup


def pkg_config(prefix):
    env = dict(os.environ)
    if prefix:
        dirs = [os.path.join(prefix, d, "pkgconfig") for d in ("lib", "lib64", "lib/x86_64-linux-gnu",
                                                              "lib/aarch64-linux-gnu")]
        env["PKG_CONFIG_PATH"] = os.pathsep.join(dirs + [env.get("PKG_CONFIG_PATH", "")])
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "orbite"], env=env, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    inc, libdirs = [], []
    for flag in shlex.split(out):
        if flag.startswith("-I"):
            inc.append(flag[2:])
        elif flag.startswith("-L"):
            libdirs.append(flag[2:])
    return inc, libdirs


def locate():
    prefix = os.environ.get("ORBITE_PREFIX")
    found = pkg_config(prefix)
    if found is not None and found[0] and found[1]:
        return found
    for p in ([prefix] if prefix else []) + ["/usr/local", "/usr"]:
        header = os.path.join(p, "include", "orbite", "orbite.h")
        for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
            if os.path.exists(header) and os.path.exists(os.path.join(p, libdir, "liborbite.so")):
                return [os.path.join(p, "include")], [os.path.join(p, libdir)]
    raise SystemExit("orbite: liborbite was not found: install it (cmake --install build) and set "
                     "ORBITE_PREFIX to its prefix, or make `pkg-config orbite` find it")


include_dirs, library_dirs = locate()
extension = Extension(
    "orbite._orbite",
    sources=["src/_orbite.c"],
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    runtime_library_dirs=library_dirs,
    libraries=["orbite"],
    py_limited_api=True,
    extra_compile_args=["-std=c11", "-fvisibility=hidden"],
)

setup(ext_modules=[extension], options={"bdist_wheel": {"py_limited_api": "cp311"}})
