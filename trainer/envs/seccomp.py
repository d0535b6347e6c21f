"""The python tool's system-call filter: a classic-BPF seccomp program, built here, that bwrap loads.

The policy (docs/TOOLS.md has the table and why each group is refused):
- a call made through another ABI than the machine's own (i386 `int 0x80` on x86_64, the x32 bit)
  kills the process: the numbers below mean something else there, and no Python program needs them;
- a call numbered past the newest this table was reviewed against (MAX_REVIEWED_NR) fails with ENOSYS,
  so a system call a future kernel adds is refused until someone has looked at it;
- clone3 fails with ENOSYS (its flags sit in a struct a filter cannot read; glibc then falls back to
  clone), and clone with any CLONE_NEW* flag fails with EPERM;
- fcntl's lock, lease and directory-notification commands (FCNTL_REFUSED) fail with EPERM: a lock on a
  read-only bound host file (the standard library's) is seen by every other sandbox and by the host, a
  channel between calls; flock and inotify (in REFUSED) are refused for the same reason;
- each call in REFUSED fails with EPERM;
- everything else is allowed.

It is a deny-list inside a default-deny frame (foreign ABIs, unknown numbers): an allow-list of what
CPython and glibc call would break on every glibc or CPython upgrade that starts using a new call, and
the namespaces, the read-only mounts and the rlimits already bound what the allowed calls can reach.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterable

# Per machine: (AUDIT_ARCH_* of its native ABI, the bit that marks a foreign ABI's numbers, or 0).
ARCHES = {"x86_64": (0xC000003E, 0x40000000), "aarch64": (0xC00000B7, 0)}
MAX_REVIEWED_NR = 469  # file_setattr (Linux 6.17); numbers from 424 up are the same on every arch

# name: (x86_64 number, aarch64 number or None where the call does not exist there), by group.
Table = dict[str, tuple[int, int | None]]
NETWORK: Table = {"socket": (41, 198), "socketpair": (53, 199)}
KERNEL_SURFACE: Table = {
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "io_setup": (206, 0),
    "io_destroy": (207, 1),
    "io_submit": (209, 2),
    "io_cancel": (210, 3),
    "io_getevents": (208, 4),
    "io_pgetevents": (333, 292),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "modify_ldt": (154, None),
    "personality": (135, 92),
}
OTHER_PROCESSES: Table = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440),
    "process_mrelease": (448, 448),
    "move_pages": (279, 239),
    "migrate_pages": (256, 238),
}
NAMESPACES_AND_MOUNTS: Table = {
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "statmount": (457, 457),
    "listmount": (458, 458),
    "open_tree_attr": (467, 467),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262),
    "fanotify_mark": (301, 263),
}
UNCOUNTED_MEMORY: Table = {  # memory that neither RLIMIT_AS nor the scratch tmpfs's size would count
    "shmget": (29, 194),
    "shmat": (30, 196),
    "shmctl": (31, 195),
    "shmdt": (67, 197),
    "msgget": (68, 186),
    "msgsnd": (69, 189),
    "msgrcv": (70, 188),
    "msgctl": (71, 187),
    "semget": (64, 190),
    "semop": (65, 193),
    "semctl": (66, 191),
    "semtimedop": (220, 192),
    "mq_open": (240, 180),
    "mq_unlink": (241, 181),
    "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184),
    "mq_getsetattr": (245, 185),
    "memfd_create": (319, 279),
    "memfd_secret": (447, 447),
}
HOST_ADMINISTRATION: Table = {  # each needs a capability the sandbox lacks: refused before the kernel looks
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "syslog": (103, 116),
    "sethostname": (170, 161),
    "setdomainname": (171, 162),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    "iopl": (172, None),
    "ioperm": (173, None),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "vhangup": (153, 58),
    "nfsservctl": (180, 42),
    "lookup_dcookie": (212, 18),
    "_sysctl": (156, None),
    "uselib": (134, None),
    "ustat": (136, None),
    "sysfs": (139, None),
    "create_module": (174, None),
    "get_kernel_syms": (177, None),
    "query_module": (178, None),
}
CHANNELS: Table = {  # locks and watches on the read-only host files every sandbox shares: seen across calls
    "flock": (73, 32),
    "inotify_init": (253, None),
    "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27),
    "inotify_rm_watch": (255, 28),
}
REFUSED_GROUPS: dict[str, Table] = {
    "network": NETWORK,
    "kernel surface": KERNEL_SURFACE,
    "other processes": OTHER_PROCESSES,
    "namespaces and mounts": NAMESPACES_AND_MOUNTS,
    "uncounted memory": UNCOUNTED_MEMORY,
    "host administration": HOST_ADMINISTRATION,
    "channels between calls": CHANNELS,
}
REFUSED: Table = {name: numbers for group in REFUSED_GROUPS.values() for name, numbers in group.items()}
CLONE: Table = {"clone": (56, 220), "clone3": (435, 435)}
FCNTL: Table = {"fcntl": (72, 25)}
# fcntl commands refused: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW (record locks),
# F_SETLEASE, F_GETLEASE (leases), F_NOTIFY (dnotify: another sandbox's reads of a bound directory).
FCNTL_REFUSED = {
    "F_GETLK": 5,
    "F_SETLK": 6,
    "F_SETLKW": 7,
    "F_OFD_GETLK": 36,
    "F_OFD_SETLK": 37,
    "F_OFD_SETLKW": 38,
    "F_SETLEASE": 1024,
    "F_GETLEASE": 1025,
    "F_NOTIFY": 1026,
}
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
# (CLONE_NEWTIME, 0x80, is clone's exit-signal byte: it only means a namespace to unshare and clone3).
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_ABS, _JEQ, _JGE, _JGT, _JSET, _RET = 0x20, 0x15, 0x35, 0x25, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
# offsets in struct seccomp_data (little-endian: an argument's low word; fcntl's cmd is an int, and the
# kernel reads only those 32 bits of it)
_NR, _ARCH, _ARG0_LOW, _ARG1_LOW = 0, 4, 16, 24


def errno_action(code: int) -> int:
    return RET_ERRNO | code


def number_of(name: str, machine: str) -> int | None:
    """The system-call number of `name` (in REFUSED or CLONE) on `machine`; None where it does not exist."""
    x86_64, aarch64 = {**REFUSED, **CLONE, **FCNTL}[name]
    return x86_64 if machine == "x86_64" else aarch64


def refused_numbers(machine: str) -> dict[int, str]:
    """The numbers REFUSED has on `machine` (x86_64 or aarch64), each with its call's name."""
    numbers = {name: number_of(name, machine) for name in REFUSED}
    return {number: name for name, number in numbers.items() if number is not None}


def _program(machine: str) -> Iterable[tuple[int, int, int, int]]:
    arch, foreign_bit = ARCHES[machine]
    clone, clone3 = number_of("clone", machine), number_of("clone3", machine)
    assert clone is not None and clone3 is not None
    eperm, enosys = errno_action(errno.EPERM), errno_action(errno.ENOSYS)
    yield (_LD_ABS, 0, 0, _ARCH)
    yield (_JEQ, 1, 0, arch)
    yield (_RET, 0, 0, RET_KILL_PROCESS)
    yield (_LD_ABS, 0, 0, _NR)
    if foreign_bit:
        yield (_JGE, 0, 1, foreign_bit)
        yield (_RET, 0, 0, RET_KILL_PROCESS)
    yield (_JGT, 0, 1, MAX_REVIEWED_NR)
    yield (_RET, 0, 0, enosys)
    yield (_JEQ, 0, 1, clone3)
    yield (_RET, 0, 0, enosys)
    yield (_JEQ, 0, 4, clone)  # not clone: skip its four instructions (the accumulator still holds nr)
    yield (_LD_ABS, 0, 0, _ARG0_LOW)
    yield (_JSET, 0, 1, CLONE_NEW_FLAGS)
    yield (_RET, 0, 0, eperm)
    yield (_RET, 0, 0, RET_ALLOW)
    fcntl = number_of("fcntl", machine)
    assert fcntl is not None
    commands = sorted(FCNTL_REFUSED.values())
    yield (_JEQ, 0, 2 + len(commands) + 1, fcntl)  # not fcntl: skip its instructions
    yield (_LD_ABS, 0, 0, _ARG1_LOW)
    for left, command in enumerate(commands):
        yield (_JEQ, len(commands) - left, 0, command)  # a refused command: jump to the EPERM below
    yield (_RET, 0, 0, RET_ALLOW)
    yield (_RET, 0, 0, eperm)
    for number in sorted(refused_numbers(machine)):
        yield (_JEQ, 0, 1, number)
        yield (_RET, 0, 0, eperm)
    yield (_RET, 0, 0, RET_ALLOW)


def filter_program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one) as struct sock_filter[]; ValueError on a machine
    without a reviewed table (the sandbox then refuses to run rather than run unfiltered)."""
    machine = machine or os.uname().machine
    if machine not in ARCHES:
        raise ValueError(
            f"no system-call table for {machine}: the python tool's filter knows {sorted(ARCHES)}"
        )
    return b"".join(struct.pack("=HBBI", *insn) for insn in _program(machine))
