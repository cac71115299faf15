import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// When an outside unlock method (the desktop keyring) may open the vault by itself.
///
/// As with a PAM login keyring, the desktop keyring opens the vault once per login session:
/// after that, an explicit `lock` or the idle timeout hold until an explicit unlock or a new
/// login session. The session is the kernel's audit session (`/proc/self/sessionid`, set by the
/// login), else `XDG_SESSION_ID`, together with the boot id; it is remembered per vault in
/// `$XDG_STATE_HOME/lockbox/sessions/`.
extension Vault {
    /// Whether ``unlock(with:)`` may be tried without the user asking for it: the vault has
    /// not been unlocked or locked in this login session yet.
    public var mayUnlockAutomatically: Bool {
        withState { state in !isExplicitlyLocked(state) }
    }

    /// Locked or unlocked in this login session already.
    func isExplicitlyLocked(_ state: State) -> Bool {
        guard let recorded = Self.readSmallFile(sessionMarkerPath(state)) else { return false }
        return recorded == Self.currentSession()
    }

    /// Records that the user locked or unlocked the vault in this session (an explicit unlock
    /// counts too: a later lock or idle timeout in the same session then holds).
    func markExplicitLock(_ state: State) {
        Self.writeSmallFile(sessionMarkerPath(state), Self.currentSession())
    }

    /// Forgets that the vault was locked or unlocked in this login session, as a new login
    /// session does (for tests of the rule above).
    package func forgetLoginSession() {
        withState { state in _ = unlink(sessionMarkerPath(state)) }
    }

    private func sessionMarkerPath(_ state: State) -> String {
        FilePermissions.directory(of: configuration.device.resolvedKeyPath) + "/sessions/" + state.header.vaultID.hexString
    }

    static func currentSession() -> [UInt8] {
        var session = readSmallFile("/proc/self/sessionid").map { String(decoding: $0, as: UTF8.self) } ?? ""
        session = session.trimmingCharacters(in: " \n")
        if session.isEmpty || session == "4294967295" {
            session = ProcessEnvironment.value("XDG_SESSION_ID") ?? ""
        }
        let boot = readSmallFile("/proc/sys/kernel/random/boot_id").map { String(decoding: $0, as: UTF8.self) } ?? ""
        return Array((boot.trimmingCharacters(in: " \n") + "/" + session).utf8)
    }

    static func readSmallFile(_ path: String) -> [UInt8]? {
        let descriptor = Glibc.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes = [UInt8](repeating: 0, count: 256)
        let count = bytes.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        guard count >= 0 else { return nil }
        return Array(bytes[0..<count])
    }

    static func writeSmallFile(_ path: String, _ bytes: [UInt8]) {
        guard (try? FilePermissions.createPrivateDirectory(FilePermissions.directory(of: path))) != nil else { return }
        let temporary = path + ".\(getpid())"
        let descriptor = Glibc.open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { return }
        _ = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        close(descriptor)
        if rename(temporary, path) != 0 { unlink(temporary) }
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: String) -> String {
        let characters = Set(set)
        var slice = Substring(self)
        while let first = slice.first, characters.contains(first) { slice.removeFirst() }
        while let last = slice.last, characters.contains(last) { slice.removeLast() }
        return String(slice)
    }
}
