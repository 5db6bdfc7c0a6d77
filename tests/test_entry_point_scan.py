"""The entry-point scan (core/entry_point_scan.py) against importlib.metadata, its oracle.

Every comparison is with ``importlib.metadata.entry_points(group=...)`` and ``dist.metadata``, or with
what the fake distributions written here hold; sys.path is replaced by temporary directories where
the order and shadowing rules matter. Checks after a change on disk use no importlib.metadata answer:
importlib caches each directory's listing per (directory, mtime) within a process.
"""
from __future__ import annotations

import importlib.metadata as md
import sys
import zipfile

import pytest

from toolkit.core import entry_point_scan
from toolkit.core.entry_point_scan import entry_points, name_and_version, scan
from toolkit.core.plugins import PluginSet

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="the scan answers from Python 3.11")


def oracle(group):
    return [(ep, str(ep.dist._path)) for ep in md.entry_points(group=group)]


def answer(found):
    return [(ep, str(dist._path)) for ep, dist in found]


def dist(directory, dirname, entry_points_txt=None, name=None, version="1.0", body="", metadata="METADATA"):
    """A fake installed distribution ``directory/dirname`` (METADATA, optional entry_points.txt)."""
    info = directory / dirname
    info.mkdir(parents=True)
    name = name or dirname.partition("-")[0].partition(".")[0]
    (info / metadata).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n{body}")
    if entry_points_txt is not None:
        (info / "entry_points.txt").write_text(entry_points_txt)
    return info


@pytest.fixture
def paths(tmp_path, monkeypatch):
    """sys.path = two fresh directories (and one that does not exist), nothing else."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "missing"), str(second)])
    return first, second


@pytest.mark.parametrize("group", ["toolkit", "toolkit.direct_convert", "console_scripts", "pytest11"])
def test_same_answer_as_importlib_on_this_environment(group):
    assert answer(scan(group)) == oracle(group)


def test_toolkit_group_is_not_empty_here():
    names = {ep.name for ep, _ in scan("toolkit")}
    assert {"gguf", "safetensors", "llama"} <= names


def test_name_and_version_match_metadata_for_every_installed_distribution():
    dists = list(md.distributions())
    assert len(dists) > 10
    for d in dists:
        assert name_and_version(d) == (d.metadata["Name"], d.metadata["Version"]), d._path


def test_same_answer_as_importlib_on_fake_distributions(paths):
    first, second = paths
    group = "[toolkit]\nzeta = z.mod\nalpha = a.mod:obj\n"
    dist(first, "plain-1.0.dist-info", group + "\n[console_scripts]\nplain = plain.cli:main\n")
    dist(first, "nothing-2.0.dist-info")  # no entry_points.txt
    dist(first, "other-1.0.dist-info", "[console_scripts]\nother = other:main\n")
    dist(first, "eggy.egg-info", "# comment\n\n[toolkit]\n  eggy   =   eggy.plugin  \n[toolkit]\nmore=eggy.more\n")
    (first / "old.egg-info").write_text("Metadata-Version: 1.0\nName: old\nVersion: 0.1\n")  # distutils' single file
    dist(first, "Shadow_Pkg-1.0.dist-info")  # no entry points: still shadows the later one of the same name
    dist(second, "shadow.pkg-2.0.dist-info", "[toolkit]\nshadowed = never.loaded\n")
    dist(second, "plain-9.0.dist-info", "[toolkit]\nplain-again = never.loaded\n")
    dist(second, "late-1.0.dist-info", "[toolkit]\nlate = late.mod\n[toolkit.direct_convert]\nfmt = late:plan\n")
    dist(first, "same_name-1.0.dist-info", "[toolkit]\ndup = first.copy\n")
    dist(first, "same.name-2.0.dist-info", "[toolkit]\ndup = second.copy\n")
    for group_name in ("toolkit", "toolkit.direct_convert", "console_scripts"):
        assert answer(scan(group_name)) == oracle(group_name)
        assert answer(entry_points(group_name)) == oracle(group_name)
    names = [ep.name for ep, _ in scan("toolkit")]
    assert "shadowed" not in names and "plain-again" not in names and names.count("dup") == 1
    assert {"zeta", "alpha", "eggy", "more", "late"} <= set(names)
    assert [ep.value for ep, _ in scan("toolkit") if ep.name == "eggy"] == ["eggy.plugin"]


def test_installed_removed_and_rewritten_distributions_are_seen(paths):
    first, _ = paths
    assert scan("toolkit") == []
    info = dist(first, "tk_new-1.0.dist-info", "[toolkit]\nnew-plugin = tk_new.plugin\n", name="tk-new", version="1.0")
    [(ep, found)] = scan("toolkit")
    assert (ep.name, ep.value, ep.group) == ("new-plugin", "tk_new.plugin", "toolkit")
    assert name_and_version(found) == ("tk-new", "1.0")
    (info / "entry_points.txt").write_text("[toolkit]\nnew-plugin = tk_new.plugout\n")  # same size, in place
    assert [ep.value for ep, _ in scan("toolkit")] == ["tk_new.plugout"]
    (info / "entry_points.txt").unlink()
    (info / "METADATA").unlink()
    info.rmdir()
    assert scan("toolkit") == []


def test_plugin_set_shows_distribution_and_version(paths):
    first, _ = paths
    (first / "tk_scan_plugin.py").write_text("")
    dist(first, "tk_scan_dist-3.1.dist-info", "[toolkit]\ntk-scan = tk_scan_plugin\n", name="tk-scan-dist",
         version="3.1", body="A long description.\n" * 100)
    plugins = PluginSet()
    try:
        plugins.load_entry_points()
    finally:
        sys.modules.pop("tk_scan_plugin", None)
    info = plugins.infos["tk-scan"]
    assert (info.distribution, info.version, info.is_builtin, info.error) == ("tk-scan-dist", "3.1", False, None)


def test_malformed_file_raises_what_importlib_raises(paths):
    first, _ = paths
    dist(first, "broken-1.0.dist-info", "[console_scripts]\nno equals sign here\n")
    with pytest.raises(Exception) as expected:
        md.entry_points(group="toolkit")
    with pytest.raises(expected.type):
        entry_points("toolkit")


@pytest.mark.parametrize("case", ["zip", "uppercase", "finder", "oserror"])
def test_falls_back_to_importlib_where_the_scan_cannot_promise_its_answer(paths, monkeypatch, tmp_path, case):
    first, _ = paths
    dist(first, "kept-1.0.dist-info", "[toolkit]\nkept = kept.mod\n")
    expected = {"kept"}
    if case == "zip":  # a zip on sys.path can hold distributions; importlib reads them
        archive = tmp_path / "bundle.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("zipped-1.0.dist-info/METADATA", "Name: zipped\nVersion: 1.0\n")
            zf.writestr("zipped-1.0.dist-info/entry_points.txt", "[toolkit]\nzipped = zipped.mod\n")
        sys.path.append(str(archive))
        expected.add("zipped")
    elif case == "uppercase":  # importlib names this one from its METADATA, not from the directory
        dist(first, "Upper-1.0.DIST-INFO", "[toolkit]\nupper = upper.mod\n", name="upper")
        expected.add("upper")
    elif case == "finder":  # another finder's distributions count for importlib
        elsewhere = dist(tmp_path / "elsewhere", "found-1.0.dist-info", "[toolkit]\nfound = found.mod\n")

        class Finder:
            @staticmethod
            def find_spec(*args, **kwargs):
                return None

            @staticmethod
            def find_distributions(context=None):
                yield md.PathDistribution(elsewhere)

        monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder])
        expected.add("found")
    else:  # any error inside the scan
        monkeypatch.setattr(entry_point_scan.os, "scandir", lambda path: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(Exception):
        scan("toolkit")
    assert {ep.name for ep, _ in entry_points("toolkit")} == expected
    assert [ep for ep, _ in entry_points("toolkit")] == list(md.entry_points(group="toolkit"))


def test_switch_off_uses_importlib_alone(paths, monkeypatch):
    first, _ = paths
    dist(first, "kept-1.0.dist-info", "[toolkit]\nkept = kept.mod\n")

    def fail(group):
        raise AssertionError("scan ran with TOOLKIT_PLUGIN_SCAN=0")

    monkeypatch.setattr(entry_point_scan, "scan", fail)
    monkeypatch.setenv("TOOLKIT_PLUGIN_SCAN", "0")
    assert answer(entry_points("toolkit")) == oracle("toolkit") and len(oracle("toolkit")) == 1


def test_egg_info_metadata_from_pkg_info(paths):
    first, _ = paths
    info = dist(first, "eggpkg.egg-info", "[toolkit]\neggpkg = eggpkg\n", name="EggPkg", version="0.3",
                metadata="PKG-INFO")
    [(_, found)] = scan("toolkit")
    assert name_and_version(found) == ("EggPkg", "0.3") == (md.PathDistribution(info).metadata["Name"], "0.3")
