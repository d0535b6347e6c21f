"""Hostile programs for the python tool's sandbox, as a model's program would call it, each with what must
hold (tests/security/test_hostile_programs.py runs them).

Placeholders, filled in by the test: JOB_DIR and JOB_FILE (a folder and a file of the job on the host, as a
model might guess them), MARKER (a unique name: nothing by that name may appear on the host). System-call
numbers are x86_64's (from the kernel's unistd_64.h), written here independently of the filter's table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

Outcome = Literal["ok", "error", "timeout", "sigsys"]

# raw(nr, *args) -> (return value, errno): a system call through libc's syscall(), so Python cannot hide it.
RAW = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(nr, *args):
    ctypes.set_errno(0)
    value = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return value, ctypes.get_errno()
"""
EPERM, ENOSYS = "(-1, 1)", "(-1, 38)"
CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x40000000, 0x10000000, 0x00020000, 17
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Hostile:
    program: str
    outcome: Outcome
    expect: str = ""  # must appear in the output (the exact refusal, or the result)
    exact: bool = False  # the output, stripped, must equal `expect`
    check: Callable[[str], bool] | None = None  # a further condition on the output
    raw: bool = False  # uses x86_64 system-call numbers


def _raw(call: str, expect: str = EPERM) -> Hostile:
    return Hostile(RAW + f"print(raw({call}))", "ok", expect, exact=True, raw=True)


def _refused(statement: str, message: str = "[Errno 1] Operation not permitted") -> Hostile:
    return Hostile(statement, "error", message)


def _total_mib_within(budget_mib: int) -> Callable[[str], bool]:
    def within(output: str) -> bool:
        return int(output.split()[1]) <= budget_mib

    return within


_WALK_PROC = """import os
seen = []
for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):
    for name in ('environ', 'cmdline'):
        try:
            seen.append((pid, name, open(f'/proc/{pid}/{name}', 'rb').read()))
        except OSError as err:
            seen.append((pid, name, str(err)))
print(sorted({pid for pid, _, _ in seen}))
print(seen)
"""
_INT80_GETPID = """import ctypes, mmap
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20 (i386 getpid); int 0x80; ret
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print('returned', call())
"""
_FILL_SCRATCH = """total = 0
try:
    for i in range(1000):
        with open(f'fill-{i}', 'wb') as f:
            for _ in range(8):
                f.write(b'x' * 2**20)
                f.flush()
                total += 1
except OSError as err:
    print('total', total, err)
"""
_FILL_ONE_FILE = """total = 0
try:
    with open('big', 'wb') as f:
        while True:
            f.write(b'x' * 2**20)
            f.flush()
            total += 1
except OSError as err:
    print('total', total, err)
"""
# processes=8: the program and at most 7 children (fewer while another sandbox of the same user runs).
_COUNT_FORKS = """import os, time
children = 0
try:
    while children < 100:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        children += 1
except OSError as err:
    print(children, err.strerror)
"""
_WRITABLE_MOUNTS = """for line in open('/proc/self/mountinfo'):
    fields = line.split()
    options, rest = fields[5].split(','), fields[fields.index('-') + 1 :]
    if 'rw' in options:
        print(fields[4], rest[0], rest[2])
"""

PROGRAMS: dict[str, Hostile] = {
    # ---- secrets: the parent's environment exists nowhere inside
    "reads-pid1-environ": Hostile(
        "print(open('/proc/1/environ', 'rb').read())",
        "ok",
        "b'HOME=/work\\x00TMPDIR=/work\\x00LD_LIBRARY_PATH=",
    ),
    "reads-own-environ": Hostile("print(open('/proc/self/environ', 'rb').read())", "ok", "HOME=/work"),
    "lists-os-environ": Hostile(
        "import os\nprint(sorted(os.environ))",
        "ok",
        "['HOME', 'LD_LIBRARY_PATH', 'PWD', 'TMPDIR']",
        exact=True,
    ),
    "walks-proc-environ-and-cmdline": Hostile(_WALK_PROC, "ok", "['1']\n"),
    "is-alone-in-its-pid-namespace": Hostile(
        "import os\nprint(os.getpid(), os.getppid())", "ok", "1 0", exact=True
    ),
    "inherits-no-descriptors": Hostile(
        "import os\nprint(sorted(os.listdir('/proc/self/fd')))", "ok", "['0', '1', '2', '3']", exact=True
    ),
    "holds-no-capability": Hostile(
        "fields = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print([fields[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Seccomp')])",
        "ok",
        "['0000000000000000', '0000000000000000', '0000000000000000', '1', '2']",
        exact=True,
    ),
    "reads-host-root-through-proc": _refused("open('/proc/1/root/etc/passwd')", "No such file or directory"),
    # ---- the file system: nothing of the host's, nothing writable but /work
    "reads-etc-shadow": _refused("open('/etc/shadow')", "No such file or directory"),
    "reads-the-jobs-file": _refused("print(open('JOB_FILE').read())", "No such file or directory"),
    "lists-the-jobs-folder": _refused("import os\nprint(os.listdir('JOB_DIR'))", "No such file or directory"),
    "writes-the-jobs-folder": _refused("open('JOB_DIR/MARKER', 'w').write('x')", "No such file or directory"),
    "writes-tmp": _refused("open('/tmp/MARKER', 'w').write('x')", "No such file or directory"),
    "writes-dev-shm": _refused("open('/dev/shm/MARKER', 'w').write('x')", "No such file or directory"),
    "posix-shared-memory": _refused(
        "from multiprocessing import shared_memory\nshared_memory.SharedMemory('MARKER', create=True, size=2**28)",
        "No such file or directory",
    ),
    "writes-the-root": _refused("open('/MARKER', 'w').write('x')", "Read-only file system"),
    "writes-the-standard-library": _refused(
        "import os, sysconfig\nopen(os.path.join(sysconfig.get_paths()['stdlib'], 'MARKER.py'), 'w')",
        "Read-only file system",
    ),
    "makes-a-folder-under-dev": _refused("import os\nos.mkdir('/dev/MARKER')", "Read-only file system"),
    "writes-proc-sys": _refused("open('/proc/sys/kernel/hostname', 'w').write('x')", "Permission denied"),
    "symlinks-to-a-host-file": _refused(
        "import os\nos.symlink('/etc/shadow', 'link')\nprint(open('link').read())",
        "No such file or directory",
    ),
    "hard-links-a-host-file": _refused(
        "import os, sys\nos.link(sys.executable, 'python')", "[Errno 18] Invalid cross-device link"
    ),
    "makes-a-device-node": _refused(
        "import os, stat\nos.mknod('null', stat.S_IFCHR | 0o666, os.makedev(1, 3))"
    ),
    "chroots": _refused("import os\nos.chroot('/work')"),
    "sees-only-its-own-root": Hostile(
        "import os\nprint(sorted(os.listdir('/')), sorted(os.listdir('/dev')))",
        "ok",
        "['bin', 'dev', 'lib', 'lib64', 'proc', 'usr', 'work'] "
        "['fd', 'full', 'null', 'random', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']",
        exact=True,
    ),
    "finds-only-capped-writable-mounts": Hostile(
        _WRITABLE_MOUNTS,
        "ok",
        check=lambda out: (
            sorted(line.split()[0] for line in out.splitlines())
            == ["/dev/full", "/dev/null", "/dev/random", "/dev/urandom", "/dev/zero", "/proc", "/work"]
            and all("size=" in line for line in out.splitlines() if line.startswith("/work "))
        ),
    ),
    # ---- memory and storage: the scratch tmpfs's size is the total, RLIMIT_AS the anonymous memory
    "fills-the-scratch-with-many-files": Hostile(
        _FILL_SCRATCH, "ok", "No space left on device", check=_total_mib_within(64)
    ),
    "fills-one-huge-file": Hostile(_FILL_ONE_FILE, "ok", "total", check=_total_mib_within(64)),
    "allocates-past-rlimit-as": _refused("x = bytearray(256 * 2**20)", "MemoryError"),
    "maps-a-gigabyte": _refused("import mmap\nm = mmap.mmap(-1, 2**30)", "[Errno 12] Cannot allocate memory"),
    "memfd-create": _refused("import os\nos.memfd_create('MARKER')"),
    "sysv-shared-memory": _raw("29, 0, 2**30, 0o1600"),  # shmget(IPC_PRIVATE, 1 GiB, IPC_CREAT | 0600)
    "sysv-message-queue": _raw("68, 0, 0o1600"),  # msgget(IPC_PRIVATE, IPC_CREAT | 0600)
    "posix-message-queue": _raw("240, 0, 0o100, 0o600, 0"),  # mq_open (a NULL name would be EFAULT)
    "fork-bomb": _refused("import os\nwhile True: os.fork()", "Resource temporarily unavailable"),
    "counts-its-processes": Hostile(_COUNT_FORKS, "ok", check=lambda out: 1 <= int(out.split()[0]) <= 7),
    "thread-bomb": _refused(
        "import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(9,), daemon=True).start()",
        "can't start new thread",
    ),
    "opens-files-without-end": _refused(
        "fs = []\nwhile True: fs.append(open('/dev/null'))", "[Errno 24] Too many open files"
    ),
    # ---- the network: no socket of any family
    "socket-inet": _refused("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)"),
    "socket-inet6": _refused("import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"),
    "socket-unix": _refused("import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)"),
    "socket-netlink": _refused("import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)"),
    "socket-packet": _refused("import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)"),
    "socketpair": _refused("import socket\nsocket.socketpair()"),
    "raw-socket-call": _raw("41, 2, 1, 0"),  # socket(AF_INET, SOCK_STREAM, 0)
    # ---- the kernel's surface and other processes (raw calls: EPERM, or ENOSYS where stated)
    "io-uring-setup": _raw("425, 8, 0"),
    "io-uring-enter": _raw("426, 0, 1, 0, 0, 0, 0"),
    "aio-setup": _raw("206, 1, 0"),
    "ptrace-attach-pid-1": _raw("101, 16, 1, 0, 0"),  # PTRACE_ATTACH
    "ptrace-traceme": _raw("101, 0, 0, 0, 0"),  # PTRACE_TRACEME (allowed it would return 0)
    "process-vm-readv": _raw("310, 1, 0, 0, 0, 0, 0"),
    "pidfd-getfd": _raw("438, 0, 0, 0"),
    "unshare-user": _raw(f"272, {CLONE_NEWUSER}"),
    "unshare-nothing": _raw("272, 0"),  # allowed it would return 0: the call is refused whatever its flags
    "setns": _raw("308, 0, 0"),
    "clone-new-net": _raw(f"56, {CLONE_NEWNET | SIGCHLD}, 0, 0, 0, 0"),
    "clone-new-mount": _raw(f"56, {CLONE_NEWNS | SIGCHLD}, 0, 0, 0, 0"),
    "clone3": _raw("435, 0, 0", ENOSYS),
    "mount": _raw("165, 0, 0, 0, 0, 0"),
    "pivot-root": _raw("155, 0, 0"),
    "open-tree": _raw("428, 0, 0, 0"),
    "open-by-handle": _raw("304, 0, 0, 0"),
    "bpf": _raw("321, 5, 0, 0"),  # BPF_PROG_LOAD
    "perf-event-open": _raw("298, 0, 0, -1, -1, 0"),
    "keyctl": _raw("250, 0, -3, 0"),
    "add-key": _raw("248, 0, 0, 0, 0, 0"),
    "request-key": _raw("249, 0, 0, 0, 0"),
    "userfaultfd": _raw("323, 0"),
    "personality": _raw("135, 0xFFFFFFFF"),
    "modify-ldt": _raw("154, 0, 0, 0"),
    "kexec-load": _raw("246, 0, 0, 0, 0"),
    "finit-module": _raw("313, 0, 0, 0"),
    "a-call-newer-than-the-table": _raw("470", ENOSYS),
    "a-call-far-past-the-table": _raw("1000", ENOSYS),
    "x32-abi": Hostile(RAW + "print(raw(0x40000000 | 39))", "sigsys", raw=True),  # x32's getpid
    "i386-abi-via-int-0x80": Hostile(_INT80_GETPID, "sigsys", raw=True),
    # ---- channels between calls: locks and watches on the read-only host files every sandbox shares
    "flocks-a-host-file": _refused(
        "import fcntl, os\nfcntl.flock(open(os.__file__), fcntl.LOCK_SH | fcntl.LOCK_NB)"
    ),
    "lockf-a-host-file": _refused(
        "import fcntl, os\nfcntl.lockf(open(os.__file__), fcntl.LOCK_SH | fcntl.LOCK_NB)"
    ),
    "ofd-locks-a-host-file": _refused(
        "import fcntl, os, struct\n"
        "fcntl.fcntl(open(os.__file__), fcntl.F_OFD_SETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0))"
    ),
    "tests-a-host-files-lock": _refused(
        "import fcntl, os, struct\n"
        "fcntl.fcntl(open(os.__file__), fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0))"
    ),
    "dnotify-on-a-host-folder": _refused(
        "import fcntl, os\n"
        "fcntl.fcntl(os.open(os.path.dirname(os.__file__), os.O_RDONLY), fcntl.F_NOTIFY, fcntl.DN_ACCESS)"
    ),
    "inotify-init1": _raw("294, 0"),
    "inotify-add-watch": _raw("254, 0, 0, 0"),
    "flock-in-its-own-scratch": _refused(
        "import fcntl\nfcntl.flock(open('/work/f', 'w'), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    ),
    "fcntl-still-works-for-flags": Hostile(
        "import fcntl, os\nfd = os.open('/work/f', os.O_CREAT | os.O_RDWR)\n"
        "print(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC, fcntl.fcntl(fd, fcntl.F_DUPFD) > fd)",
        "ok",
        "1 True",
        exact=True,
    ),
    # ---- time and output
    "cpu-loop": Hostile("while True: pass", "timeout"),
    "sleeps-past-the-wall-clock": Hostile("import time\ntime.sleep(60)", "timeout"),
    "children-sleep-past-the-wall-clock": Hostile(
        "import os, time\nfor _ in range(3):\n    if os.fork() == 0: break\ntime.sleep(60)", "timeout"
    ),
    "orphan-keeps-spinning": Hostile(
        "import os\nif os.fork() == 0:\n    while True: pass\nprint('parent exits')",
        "ok",
        "parent exits",
        exact=True,
    ),
    "floods-stdout": Hostile("import sys\nsys.stdout.write('y' * 10**7)", "ok", "[output truncated]"),
    "floods-stderr": Hostile("import sys\nsys.stderr.write('e' * 10**7)\nraise SystemExit(3)", "error"),
    # ---- the tool stays useful
    "does-arithmetic": Hostile("print(sum(i * i for i in range(1000)))", "ok", "332833500", exact=True),
    "writes-and-reads-work": Hostile(
        "open('/work/notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())",
        "ok",
        "kept",
        exact=True,
    ),
    "uses-the-standard-library": Hostile(
        "import json, fractions, decimal\n"
        "print(fractions.Fraction(3, 4), decimal.Decimal('0.75'), json.dumps({'a': 1}))",
        "ok",
        '3/4 0.75 {"a": 1}',
        exact=True,
    ),
    "prints-unicode": Hostile("print('π≈3.14')", "ok", "π≈3.14", exact=True),
    "uses-tempfile": Hostile(
        "import tempfile\nwith tempfile.TemporaryDirectory() as d: print(d.startswith('/work/'))",
        "ok",
        "True",
        exact=True,
    ),
    "forks-and-waits": Hostile(
        "import os\npid = os.fork()\nif pid == 0: os._exit(7)\nprint(os.waitpid(pid, 0)[1] >> 8)",
        "ok",
        "7",
        exact=True,
    ),
    "runs-a-thread": Hostile(
        "import threading\nt = threading.Thread(target=print, args=('t',))\nt.start()\nt.join()",
        "ok",
        "t",
        exact=True,
    ),
}
