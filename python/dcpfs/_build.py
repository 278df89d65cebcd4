"""Build dcpfs._native (cffi, API mode) against the libdcp that pkg-config finds.

Run by setuptools through setup.py's cffi_modules. libdcp is found with
`pkg-config --cflags --libs libdcp` (honouring PKG_CONFIG_PATH, and PKG_CONFIG
for the pkg-config program); the module gets an rpath to libdcp's folder, so
`make install && pip install ./python` works without LD_LIBRARY_PATH. A build
tree is used through libdcp-uninstalled.pc, which configure writes into it:
PKG_CONFIG_PATH=<build dir> pip install ./python.
"""
import importlib.util
import os
import shlex
import subprocess

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(globals().get("__file__") or os.path.join("dcpfs", "_build.py")))


def _load_cdef():
    spec = importlib.util.spec_from_file_location("_dcpfs_cdef", os.path.join(_HERE, "_cdef.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pkg_config(*args):
    prog = os.environ.get("PKG_CONFIG") or "pkg-config"
    cmd = shlex.split(prog) + list(args) + ["libdcp"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise SystemExit(
            f"dcpfs: cannot run {prog} ({e}): install pkg-config, then libdcp (`make install` in "
            "the dcpfs build folder), or set PKG_CONFIG_PATH to the folder holding libdcp.pc")
    if r.returncode != 0:
        where = os.environ.get("PKG_CONFIG_PATH")
        raise SystemExit(
            "dcpfs: pkg-config cannot find libdcp"
            + (f" (PKG_CONFIG_PATH={where})" if where else " (PKG_CONFIG_PATH is not set)")
            + ": install libdcp (`make install` in the dcpfs build folder) or set PKG_CONFIG_PATH "
            "to the folder holding libdcp.pc (a build folder holds libdcp-uninstalled.pc)"
            + (f"\n{r.stderr.strip()}" if r.stderr.strip() else ""))
    return shlex.split(r.stdout)


def _flags():
    include_dirs, library_dirs, libraries, compile_args, link_args = [], [], [], [], []
    for f in _pkg_config("--cflags"):
        if f.startswith("-I"):
            include_dirs.append(f[2:])
        else:
            compile_args.append(f)
    for f in _pkg_config("--libs"):
        if f.startswith("-L"):
            library_dirs.append(f[2:])
        elif f.startswith("-l"):
            libraries.append(f[2:])
        else:
            link_args.append(f)
    if "dcp" not in libraries:
        libraries.append("dcp")
    # Find libdcp.so at run time where pkg-config said it is.
    link_args += [f"-Wl,-rpath,{d}" for d in library_dirs]
    return dict(include_dirs=include_dirs, library_dirs=library_dirs, libraries=libraries,
                extra_compile_args=compile_args, extra_link_args=link_args)


_cdef = _load_cdef()
ffibuilder = FFI()
ffibuilder.cdef(_cdef.CDEF)
ffibuilder.set_source("dcpfs._native", _cdef.HEADERS, **_flags())

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
