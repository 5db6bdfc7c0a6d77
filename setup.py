"""Maps core/, plugins/ and kernels/ into the single `toolkit` import namespace.

pyproject.toml holds the metadata; this file only computes the package list, so a new
sub-package (say plugins/loaders/newformat/) needs no edit here.
"""
from setuptools import find_packages, setup

ROOTS = {"toolkit": "toolkit", "toolkit.core": "core", "toolkit.plugins": "plugins", "toolkit.kernels": "kernels"}


def _packages() -> list[str]:
    found = []
    for namespace, folder in ROOTS.items():
        found.append(namespace)
        found += [f"{namespace}.{sub}" for sub in find_packages(folder)]
    return found


setup(package_dir=ROOTS, packages=_packages(), package_data={"toolkit.kernels": ["*.json"]})
