"""Start one process of an unpacked image the way a container runtime would, for tests.

Run as root under `unshare --mount --pid --fork [--net]` (tests/support/container.py does),
with one argument: a JSON spec. In the new mount namespace it

- binds the image's root filesystem onto itself, mounts a fresh /proc (the new PID
  namespace's), a /dev tmpfs with the usual device nodes bound from the host, and /sys
  read-only;
- binds each volume (host path -> container path, read-only or not) and each tmpfs;
- remounts the root read-only when the spec says so (readOnlyRootFilesystem);
- brings the loopback interface up when given its own network namespace;
- chroots, changes to the working directory, drops supplementary groups, sets the group and
  user ids (runAsGroup, runAsUser), empties the capability bounding set (capabilities:
  drop ALL), sets no_new_privs (allowPrivilegeEscalation: false), and execs the command with
  exactly the spec's environment, PATH looked up in it, inside the root.

Not reproduced: seccomp (seccompProfile: RuntimeDefault), cgroup limits, /etc/hosts and
/etc/resolv.conf bind mounts (the tests' addresses are IP literals).

Spec keys: rootfs, argv, env (dict), workdir, uid, gid, read_only_root, no_new_privs,
drop_all_caps, mounts ([host, target, read_only]), tmpfs ([target]), loopback_up.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} -> {target}",
    )


def bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def main(spec: dict) -> None:
    root = spec["rootfs"]
    inside = lambda path: os.path.join(root, path.lstrip("/"))  # noqa: E731
    mount(root, root, None, MS_BIND | MS_REC)
    os.makedirs(inside("/proc"), exist_ok=True)
    mount("proc", inside("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(inside("/dev"), exist_ok=True)
    mount("tmpfs", inside("/dev"), "tmpfs", MS_NOSUID, "mode=755,size=65536k")
    for name in DEVICES:
        bind(f"/dev/{name}", inside(f"/dev/{name}"), read_only=False)
    for link, to in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(to, inside(f"/dev/{link}"))
    os.makedirs(inside("/dev/shm"))
    mount("shm", inside("/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=65536k")
    os.makedirs(inside("/sys"), exist_ok=True)
    bind("/sys", inside("/sys"), read_only=True)
    for host, target, read_only in spec.get("mounts", []):
        bind(host, inside(target), read_only)
    for target in spec.get("tmpfs", []):
        os.makedirs(inside(target), exist_ok=True)
        mount("tmpfs", inside(target), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if spec.get("read_only_root"):
        mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    if spec.get("loopback_up"):
        loopback_up()
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())

    os.chroot(root)
    os.chdir(spec.get("workdir") or "/")
    os.setgroups([])
    os.setgid(spec["gid"])
    if spec.get("drop_all_caps"):
        for cap in range(last_cap + 1):
            _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    if spec.get("no_new_privs"):
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.setuid(spec["uid"])  # a non-zero uid: the permitted and effective capabilities go
    # a change of credentials clears the parent-death signal `unshare --kill-child` set
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    argv, env = spec["argv"], spec["env"]
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except OSError as exc:
        print(f"container_init: {exc}", file=sys.stderr)
        sys.exit(127)
