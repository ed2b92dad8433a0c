"""pip install --no-build-isolation bindings/python

Pure Python (ctypes): nothing is compiled. At install time the libgvq.so to use is found as the
package finds it at import (GVQ_LIBRARY, pkg-config's gvq, $GVQ_BUILD_DIR, the checkout's build/)
and its path is recorded in gvq/_config.py; none found is an error saying how to get one. At
import, GVQ_LIBRARY still overrides the recorded path.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_library():
    env = os.environ.get("GVQ_LIBRARY")
    dirs = []
    if env:
        if os.path.isfile(env):
            return os.path.realpath(env)
        dirs.append(env)
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "gvq"], capture_output=True,
                           text=True)
        if r.returncode == 0 and r.stdout.strip():
            dirs.append(r.stdout.strip())
    except OSError:
        pass
    if os.environ.get("GVQ_BUILD_DIR"):
        dirs.append(os.environ["GVQ_BUILD_DIR"])
    dirs.append(os.path.join(HERE, "..", "..", "build"))
    for d in dirs:
        for name in ("libgvq.so", "libgvq.so.0"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                return os.path.realpath(p)
    sys.exit("gvq: no libgvq.so found (looked at GVQ_LIBRARY, pkg-config gvq, GVQ_BUILD_DIR and "
             "%s). Build it first (cmake -S . -B build && cmake --build build, from the "
             "repository root) or set GVQ_LIBRARY to its path." % os.path.normpath(dirs[-1]))


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = find_library()
        out = os.path.join(self.build_lib, "gvq", "_config.py")
        with open(out, "w") as f:
            f.write("# written by setup.py at install time\nLIBRARY = %r\n" % lib)
        print("gvq: using %s" % lib)


setup(name="gvq", version="0.1.0", description="Python bindings of libgvq (ctypes)",
      packages=["gvq"], python_requires=">=3.9", install_requires=["numpy"],
      cmdclass={"build_py": BuildPy})
