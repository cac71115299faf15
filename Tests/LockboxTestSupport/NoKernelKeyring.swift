import Foundation

/// A seccomp wrapper that runs a command where the kernel keyring does not exist (as in a
/// container whose profile forbids `keyctl`, or Flatpak): `python3 WRAPPER COMMAND ARGS...`.
public enum NoKernelKeyring {
    /// Writes the wrapper into `directory` (the checkout may not be readable by the ordinary
    /// user scripts/test-unprivileged runs as) and returns its path.
    public static func wrapper(in directory: String) -> String {
        let path = directory + "/run-without-keyring.py"
        if !FileManager.default.fileExists(atPath: path) {
            _ = FileManager.default.createFile(atPath: path, contents: Data(wrapperSource.utf8))
        }
        return path
    }

    /// A Python program that runs a command where the kernel keyring does not exist.
    public static let wrapperSource = #"""
#!/usr/bin/env python3
# Runs a command where the kernel keyring does not exist, as in a container whose seccomp
# profile forbids it: add_key, request_key and keyctl fail with ENOSYS.
#
#     run-without-keyring.py COMMAND [ARGS...]
#
# A seccomp filter (installed with PR_SET_NO_NEW_PRIVS, so no privilege is needed) is inherited
# by the command across exec.
import ctypes
import errno
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06

# (audit architecture, add_key, request_key, keyctl) per machine.
ARCHITECTURES = {
    "x86_64": (0xC000003E, 248, 249, 250),
    "aarch64": (0xC00000B7, 217, 218, 219),
}


def instruction(code, jump_true, jump_false, k):
    return struct.pack("HBBI", code, jump_true, jump_false, k)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: run-without-keyring.py COMMAND [ARGS...]")
    machine = platform.machine()
    if machine not in ARCHITECTURES:
        sys.exit(f"run-without-keyring.py: no system call numbers for {machine}")
    arch, *calls = ARCHITECTURES[machine]
    deny = SECCOMP_RET_ERRNO | errno.ENOSYS
    program = [
        instruction(BPF_LD_W_ABS, 0, 0, 4),             # seccomp_data.arch
        instruction(BPF_JEQ_K, 1, 0, arch),
        instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),  # another ABI: leave it alone
        instruction(BPF_LD_W_ABS, 0, 0, 0),             # seccomp_data.nr
    ]
    for index, call in enumerate(calls):
        remaining = len(calls) - index - 1
        # Equal: jump over the remaining checks and the allow, to the deny.
        program.append(instruction(BPF_JEQ_K, remaining + 1, 0, call))
    program.append(instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    program.append(instruction(BPF_RET_K, 0, 0, deny))
    filter_bytes = ctypes.create_string_buffer(b"".join(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program), ctypes.addressof(filter_bytes))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        sys.exit(f"run-without-keyring.py: PR_SET_NO_NEW_PRIVS failed: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        sys.exit(f"run-without-keyring.py: PR_SET_SECCOMP failed: {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


main()
"""#
}
