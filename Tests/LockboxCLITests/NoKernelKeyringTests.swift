import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// Where the kernel keyring does not exist (a container whose seccomp profile forbids
/// `keyctl`): the default cache refuses with a message that names the alternative, and never
/// falls back to something else on its own; LOCKBOX_UNLOCK_CACHE=process works there.
@Suite("lockbox without a kernel keyring")
struct NoKernelKeyringTests {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-no-keyring")
    var keychain: String { directory.file("keychains/no-keyring.lockbox") }
    /// The wrapper, written into the test's directory: the checkout may not be readable by the
    /// ordinary user scripts/test-unprivileged runs these tests as.
    var wrapper: String {
        let path = directory.file("run-without-keyring.py")
        if !FileManager.default.fileExists(atPath: path) {
            #expect(FileManager.default.createFile(atPath: path, contents: Data(Self.wrapperSource.utf8)))
        }
        return path
    }

    func withoutKeyring(_ arguments: [String], input: String = "", cache: String? = nil) throws -> ProcessResult {
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_UNLOCK_CACHE"] = cache
        return try run("/usr/bin/python3", [wrapper, binary] + arguments, input: Array(input.utf8), environment: environment)
    }

    @Test("the wrapper really takes the kernel keyring away")
    func wrapper_removesKeyring() throws {
        let result = try run("/usr/bin/python3", [wrapper, "/usr/bin/keyctl", "show", "@u"])
        #expect(result.status != 0)
        #expect(result.standardError.contains("Function not implemented"), "\(result.standardError)")
    }

    @Test("with the default cache: errSecNotAvailable naming LOCKBOX_UNLOCK_CACHE=process, and nothing unlocked elsewhere")
    func defaultCache_refusesWithTheAlternative() throws {
        let created = try withoutKeyring(["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: "pw\n")
        #expect(created.status == 1)
        #expect(created.standardError.contains("The kernel keyring is not available here"), "\(created.standardError)")
        #expect(created.standardError.contains("LOCKBOX_UNLOCK_CACHE=process"))
        #expect(created.standardError.contains("(OSStatus -25291)"))
        // Nothing was created that could not be unlocked here.
        #expect(!FileManager.default.fileExists(atPath: keychain))
        // A vault made elsewhere: reads here are refused the same way, never "not found".
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_UNLOCK_CACHE"] = "process"
        let made = try run(
            binary, ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: Array("pw\n".utf8),
            environment: environment)
        #expect(made.status == 0, "\(made.standardError)")
        let read = try withoutKeyring(["--keychain", keychain, "find-generic-password", "-s", "s", "-a", "a", "-w"])
        #expect(read.status == 1)
        #expect(read.standardError.contains("(OSStatus -25291)"), "\(read.standardError)")
        let unlock = try withoutKeyring(["--keychain", keychain, "unlock", "--passphrase-stdin"], input: "pw\n")
        #expect(unlock.status == 1)
        #expect(unlock.standardError.contains("LOCKBOX_UNLOCK_CACHE=process"), "\(unlock.standardError)")
    }

    @Test("with LOCKBOX_UNLOCK_CACHE=process: the vault works in one process, and the next process finds it locked")
    func processCache_worksWithoutKeyring() throws {
        let created = try withoutKeyring(
            ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: "pw\n", cache: "process")
        #expect(created.status == 0, "\(created.standardError)")
        // The keys of `init` went with its process: locked, never not found, never a fallback.
        let add = try withoutKeyring(["--keychain", keychain, "add-generic-password", "-s", "s", "-a", "a"], input: "v\n", cache: "process")
        #expect(add.status == 1)
        #expect(add.standardError.contains("(OSStatus -25308)"), "\(add.standardError)")
        let status = try withoutKeyring(["--keychain", keychain, "status"], cache: "process")
        #expect(status.status == 0, "\(status.standardError)")
        #expect(status.standardOutput.contains("state: locked"), "\(status.standardOutput)")
    }

    /// A Python program that runs a command where the kernel keyring does not exist.
    static let wrapperSource = #"""
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
