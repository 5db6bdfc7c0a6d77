"""Package list for the single ``toolkit`` distribution (metadata lives in pyproject.toml).

Everything sits under toolkit/ (toolkit/core, toolkit/plugins, toolkit/kernels), so the
repository root on ``sys.path`` exposes one name, ``toolkit``, and never shadows a PyPI
package such as ``kernels``. A new sub-package needs no edit here.
"""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["toolkit", "toolkit.*"]), package_data={"toolkit.kernels": ["*.json"], "toolkit.kernels.gguf_cpu": ["*.cpp", "*.h"]})
