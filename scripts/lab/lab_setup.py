"""Prepare a machine as sm120kit's container lab: podman, its engine drop-in, and locally built node images.

Run as root through `scripts/lab/setup`. Every step is idempotent: installed packages are not reinstalled, the drop-in
is rewritten only when its content differs, and an image is rebuilt only when its cache key (this file, the image spec
and the CA certificates copied into it) changed. Root file systems are cached as tarballs under .cache/lab.
Standard library only: this runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES: tuple[str, ...] = (
    "podman",
    "runc",
    "catatonit",
    "netavark",
    "aardvark-dns",
    "iptables",
    "debootstrap",
    "zstd",
)
PACKAGES += ("cmake", "ninja-build", "g++")  # build llama-server for the real-engine tests (tests/lab/llamacpp.py)
ENGINE_DROPIN = Path("/etc/containers/containers.conf.d/sm120kit.conf")
DEFAULT_CA_DIR = Path("/usr/local/share/ca-certificates")
DEFAULT_CACHE = REPO_ROOT / ".cache" / "lab"
IMAGE_REPO = "localhost/sm120kit-node"
KEY_LABEL = "sm120kit.lab.key"
NPROC_CAP = 32768
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Ubuntu Archive Automatic Signing Key (2018) <ftpmaster@ubuntu.com>: signs noble's Release files. Debian 12 ships no
# Ubuntu keyring, so the keyring comes from Ubuntu's own archive and is accepted only if it holds this key.
UBUNTU_2018_KEY = "F6ECB3762474EDA9D21B7022871920D1991BC93C"


class LabError(Exception):
    """A setup step failed; the message says what to do."""


@dataclass(frozen=True)
class AptSource:
    """One repository entry of an apt configuration (deb822 stanza or one-line form)."""

    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]


@dataclass(frozen=True)
class ImageSpec:
    """A node image: which distribution release, from which mirrors."""

    tag: str
    suite: str
    mirror: str
    security_mirror: str
    components: tuple[str, ...]
    keyring_name: str
    debootstrap_script: str  # script name under /usr/share/debootstrap/scripts, "" for the suite's own

    @property
    def ref(self) -> str:
        return f"{IMAGE_REPO}:{self.tag}"


def parse_deb822(text: str) -> list[AptSource]:
    """Parse a deb822 `.sources` file; disabled stanzas and non-`deb` types are left out."""
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        sources.append(
            AptSource(
                uris=tuple(fields.get("uris", "").split()),
                suites=tuple(fields.get("suites", "").split()),
                components=tuple(fields.get("components", "").split()),
            )
        )
    return sources


def parse_one_line(text: str) -> list[AptSource]:
    """Parse a one-line-style `sources.list` (`deb [options] URI SUITE COMPONENT...`)."""
    sources = []
    for raw in text.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", raw.split("#", 1)[0]).split()
        if len(line) >= 3 and line[0] == "deb":
            sources.append(AptSource(uris=(line[1],), suites=(line[2],), components=tuple(line[3:])))
    return sources


def host_apt_sources(apt_dir: Path = Path("/etc/apt")) -> list[AptSource]:
    """Every enabled `deb` entry of the host's apt configuration, in apt's reading order."""
    sources = []
    one_line = apt_dir / "sources.list"
    if one_line.is_file():
        sources += parse_one_line(one_line.read_text())
    parts = apt_dir / "sources.list.d"
    for path in sorted(parts.glob("*")) if parts.is_dir() else []:
        if path.suffix == ".list":
            sources += parse_one_line(path.read_text())
        elif path.suffix == ".sources":
            sources += parse_deb822(path.read_text())
    return sources


def debian_mirrors(sources: Sequence[AptSource]) -> tuple[str, str]:
    """The host's Debian archive mirror and security mirror, taken from its apt sources."""
    mirror = security = ""
    for source in sources:
        if not source.uris:
            continue
        if not security and any(suite.endswith("-security") for suite in source.suites):
            security = source.uris[0]
        elif (
            not mirror
            and "debian" in source.uris[0]
            and any("-" not in suite and "/" not in suite for suite in source.suites)
        ):
            mirror = source.uris[0]
    if not mirror:
        raise LabError(
            "the host's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.sources) name no Debian archive "
            "mirror; pass --debian-mirror URL"
        )
    return mirror.rstrip("/"), (security or mirror.rstrip("/") + "-security").rstrip("/")


def run(cmd: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def install_packages() -> None:
    """Install the container tools that are missing (nothing when all are there)."""
    missing = []
    for package in PACKAGES:
        query = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True, text=True, check=False
        )
        if query.stdout.strip() != "install ok installed":
            missing.append(package)
    if not missing:
        print("packages: all present")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update"], env=env)
    run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env)


def engine_dropin_text() -> str:
    """containers.conf drop-in: ulimits that root here may set, runc with cgroupfs, file events, netavark."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = NPROC_CAP if nproc == resource.RLIM_INFINITY else min(nproc, NPROC_CAP)
    return (
        "# Written by sm120kit scripts/lab/setup (see scripts/lab/README.md).\n"
        "# Without these ulimits runc fails with 'setrlimit RLIMIT_NOFILE: Operation not permitted';\n"
        "# crun fails here with 'cgroups in hybrid mode not supported'.\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n\n'
        "[network]\n"
        'network_backend = "netavark"\n'
    )


def write_engine_dropin(path: Path = ENGINE_DROPIN) -> None:
    text = engine_dropin_text()
    if path.is_file() and path.read_text() == text:
        print(f"engine drop-in: {path} up to date")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"engine drop-in: wrote {path}")


def ca_certificates(ca_dir: Path | None) -> list[Path]:
    """The locally added CA certificates to copy into images (none when the option is off)."""
    if ca_dir is None or not ca_dir.is_dir():
        return []
    return sorted(path for path in ca_dir.rglob("*.crt") if path.is_file())


def cache_key(spec: ImageSpec, certs: Sequence[Path]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(repr(spec).encode())
    for cert in certs:
        digest.update(cert.name.encode() + b"\0" + cert.read_bytes())
    return digest.hexdigest()


def image_key(ref: str) -> str:
    """The cache key label of a local image, "" when the image is absent."""
    inspect = subprocess.run(
        ["podman", "image", "inspect", "--format", '{{index .Labels "' + KEY_LABEL + '"}}', ref],
        capture_output=True,
        text=True,
        check=False,
    )
    return inspect.stdout.strip() if inspect.returncode == 0 else ""


def sources_text(spec: ImageSpec) -> str:
    """The node's deb822 apt sources: release, updates and security, from the chosen mirrors."""
    keyring = f"/usr/share/keyrings/{spec.keyring_name}"
    components = " ".join(spec.components)
    return (
        f"Types: deb\nURIs: {spec.mirror}\nSuites: {spec.suite} {spec.suite}-updates\n"
        f"Components: {components}\nSigned-By: {keyring}\n\n"
        f"Types: deb\nURIs: {spec.security_mirror}\nSuites: {spec.suite}-security\n"
        f"Components: {components}\nSigned-By: {keyring}\n"
    )


def ubuntu_keyring(workdir: Path, mirror: str, suite: str) -> Path:
    """Fetch ubuntu-keyring from the Ubuntu archive and accept it only if it holds the 2018 archive key.

    The package is located through the suite's Packages index (mirrors and proxies often serve no directory
    listings); its authenticity rests on the fingerprint check, not on the unsigned index.
    """
    index_url = f"{mirror}/dists/{suite}/main/binary-amd64/Packages.gz"
    with urllib.request.urlopen(index_url, timeout=120) as response:
        index = gzip.decompress(response.read()).decode()
    stanza = re.search(r"^Package: ubuntu-keyring\n(?:.+\n)*?Filename: (\S+)", index, re.MULTILINE)
    if stanza is None:
        raise LabError(f"{index_url} lists no ubuntu-keyring package")
    deb = workdir / Path(stanza[1]).name
    with urllib.request.urlopen(f"{mirror}/{stanza[1]}", timeout=120) as response:
        deb.write_bytes(response.read())
    extract = workdir / "keyring"
    run(["dpkg-deb", "-x", str(deb), str(extract)])
    keyring = extract / "usr/share/keyrings/ubuntu-archive-keyring.gpg"
    shown = subprocess.run(
        ["gpg", "--show-keys", "--with-colons", str(keyring)], capture_output=True, text=True, check=True
    )
    if f"fpr:::::::::{UBUNTU_2018_KEY}:" not in shown.stdout:
        raise LabError(f"{deb.name} from {mirror} does not hold Ubuntu's 2018 archive key {UBUNTU_2018_KEY}")
    return keyring


def build_rootfs(spec: ImageSpec, certs: Sequence[Path], tarball: Path) -> None:
    """debootstrap a minbase root with python3 and ca-certificates, configure apt and CAs, pack it as a tarball."""
    tarball.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"build-{spec.tag}-", dir=tarball.parent))
    try:
        root = workdir / "root"
        keyring = DEBIAN_KEYRING if spec.keyring_name == Path(DEBIAN_KEYRING).name else ""
        if not keyring:
            keyring = str(ubuntu_keyring(workdir, spec.mirror, spec.suite))
        cmd = ["debootstrap", "--variant=minbase", "--include=python3,ca-certificates", f"--keyring={keyring}"]
        cmd += [f"--components={','.join(spec.components)}", spec.suite, str(root), spec.mirror]
        if spec.debootstrap_script:
            cmd.append(f"/usr/share/debootstrap/scripts/{spec.debootstrap_script}")
        run(cmd)
        if not (root / "usr/share/keyrings" / spec.keyring_name).is_file():
            shutil.copy2(keyring, root / "usr/share/keyrings" / spec.keyring_name)
        (root / "etc/apt/sources.list").unlink(missing_ok=True)
        (root / "etc/apt/sources.list.d/node.sources").write_text(sources_text(spec))
        if certs:
            target = root / "usr/local/share/ca-certificates"
            target.mkdir(parents=True, exist_ok=True)
            for cert in certs:
                shutil.copy2(cert, target / cert.name)
            run(["chroot", str(root), "update-ca-certificates"])
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file() and path.name != "lock":
                    path.unlink()
        partial = tarball.with_suffix(".partial")
        run(["tar", "--numeric-owner", "-C", str(root), "-czf", str(partial), "."])
        partial.replace(tarball)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def ensure_image(spec: ImageSpec, certs: Sequence[Path], cache: Path) -> str:
    """Make `spec.ref` exist and match the current cache key; return what was done."""
    key = cache_key(spec, certs)
    if image_key(spec.ref) == key:
        return "up to date"
    tarball = cache / f"{spec.tag}-{key[:16]}.tar.gz"
    action = "imported from cache"
    if not tarball.is_file():
        build_rootfs(spec, certs, tarball)
        action = "built"
        for stale in cache.glob(f"{spec.tag}-*.tar.gz"):
            if stale != tarball:
                stale.unlink()
    run(
        [
            "podman", "import",
            "--change", 'CMD ["sleep", "infinity"]',
            "--change", f"LABEL {KEY_LABEL}={key}",
            str(tarball), spec.ref,
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return action


def image_specs(args: argparse.Namespace) -> list[ImageSpec]:
    wanted = ("debian12", "ubuntu2404") if args.image == "all" else (args.image,)
    specs = []
    if "debian12" in wanted:
        mirror, security = (
            (args.debian_mirror, args.debian_mirror + "-security")
            if args.debian_mirror
            else (debian_mirrors(host_apt_sources()))
        )
        specs.append(ImageSpec("debian12", "bookworm", mirror, security, ("main",), "debian-archive-keyring.gpg", ""))
    if "ubuntu2404" in wanted:
        if not args.ubuntu_mirror:
            raise LabError(
                "ubuntu2404: this host's apt sources name no Ubuntu archive to take a mirror from; "
                "pass --ubuntu-mirror URL (for example your site's Ubuntu mirror)"
            )
        mirror = args.ubuntu_mirror.rstrip("/")
        # debootstrap 1.0.128 (Debian 12) has no noble script; noble bootstraps like every Ubuntu since gutsy.
        # Ubuntu installs enable universe by default; python3-venv (which the roles install) lives there in noble.
        components = ("main", "universe")
        keyring = "ubuntu-archive-keyring.gpg"
        specs.append(ImageSpec("ubuntu2404", "noble", mirror, mirror, components, keyring, "gutsy"))
    return specs


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/lab/setup", description=__doc__.splitlines()[0])
    parser.add_argument("--image", choices=("debian12", "ubuntu2404", "all", "none"), default="debian12")
    parser.add_argument(
        "--ca-dir",
        default=str(DEFAULT_CA_DIR),
        help="copy the *.crt files of this directory into images and trust them there (needed behind a "
        "TLS-intercepting proxy); '' copies none (default: %(default)s)",
    )
    parser.add_argument("--debian-mirror", default="", help="Debian archive URL (default: from the host's apt sources)")
    parser.add_argument("--ubuntu-mirror", default="", help="Ubuntu archive URL (required for ubuntu2404)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="root file system cache (default: %(default)s)")
    parser.add_argument("--skip-packages", action="store_true", help="do not install podman and friends")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("scripts/lab/setup: run as root (rootful podman, debootstrap)", file=sys.stderr)
        return 2
    try:
        if not args.skip_packages:
            install_packages()
        write_engine_dropin()
        certs = ca_certificates(Path(args.ca_dir) if args.ca_dir else None)
        print("CA certificates for images: " + (", ".join(str(c) for c in certs) or "none"))
        for spec in image_specs(args) if args.image != "none" else []:
            started = time.monotonic()
            action = ensure_image(spec, certs, Path(args.cache))
            print(f"image {spec.ref}: {action} ({time.monotonic() - started:.0f} s; mirror {spec.mirror})")
    except (LabError, subprocess.CalledProcessError, OSError) as error:
        print(f"scripts/lab/setup: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
