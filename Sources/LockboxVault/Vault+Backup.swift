import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// Backups: a file of its own, sealed with a key derived from a backup passphrase.
///
/// A backup holds the portable items only (`whenUnlocked`, `afterFirstUnlock`, `always`),
/// as an iOS backup does: `*ThisDeviceOnly` items (including `whenPasscodeSetThisDeviceOnly`)
/// and access-controlled items never leave the machine, nor do non-extractable keys. It is
/// taken in one read transaction, so it is consistent while other processes write.
///
/// Restoring merges: an item whose primary key is new is added; when an item with the same
/// primary key exists, the one modified more recently wins, and on a tie the existing one stays.
extension Vault {
    /// What a backup contains and what it left out.
    public struct BackupSummary: Sendable, Equatable {
        public var exported: Int
        /// `*ThisDeviceOnly` items, left out by design.
        public var skippedThisDeviceOnly: Int
        /// Access-controlled items, left out: their key needs this vault's passphrase.
        public var skippedAccessControlled: Int
        /// Non-extractable keys, left out: their private bytes never leave the keychain.
        public var skippedNonExtractableKeys: Int

        public init(exported: Int, skippedThisDeviceOnly: Int, skippedAccessControlled: Int, skippedNonExtractableKeys: Int = 0) {
            self.exported = exported
            self.skippedThisDeviceOnly = skippedThisDeviceOnly
            self.skippedAccessControlled = skippedAccessControlled
            self.skippedNonExtractableKeys = skippedNonExtractableKeys
        }
    }

    /// What a restore did.
    public struct RestoreSummary: Sendable, Equatable {
        public var added: Int
        /// Existing items replaced by a more recently modified one from the backup.
        public var replaced: Int
        /// Existing items kept because they were as new or newer.
        public var kept: Int

        public init(added: Int, replaced: Int, kept: Int) {
            self.added = added
            self.replaced = replaced
            self.kept = kept
        }
    }

    static let backupMagic = Array("LOCKBOX-BACKUP\n".utf8)
    static let backupVersion: UInt8 = 1

    /// Writes a backup of the portable items to a new file at `path` (mode 0600, written whole
    /// then moved into place). The vault must be unlocked.
    ///
    /// A file already at `path` is never replaced unless `replacing` is true, and then only an
    /// earlier Lockbox backup: a mistyped path must not turn the keychain itself, its device key
    /// or any other file into a backup (the keychain's ThisDeviceOnly items, which no backup
    /// holds, would be gone for good).
    /// - Throws: `duplicateItem` when a file is at `path` (nothing written); `param` when
    ///   `replacing` and that file is not a Lockbox backup.
    public func backup(to path: String, passphrase: SecretBytes, replacing: Bool = false) throws(LockboxError) -> BackupSummary {
        guard !passphrase.isEmpty else { throw LockboxError(.param, "The backup passphrase is empty.") }
        // Checked first, so that a refused path costs no key derivation; the write checks again.
        try Self.checkBackupTarget(path, replacing: replacing)
        var summary = BackupSummary(exported: 0, skippedThisDeviceOnly: 0, skippedAccessControlled: 0)
        let items: [(ItemClass, [UInt8], SecretBytes)] = try withState { state throws(LockboxError) in
            guard try state.keys.currentMaster() != nil else { throw lockedError() }
            return try state.database.readTransaction { () throws(LockboxError) -> [(ItemClass, [UInt8], SecretBytes)] in
                // A backup carries only rows that check out.
                _ = try currentIntegrity(state)
                try verifyAllBuckets(state: state)
                let statement = try state.database.statement("SELECT \(SealedRow.columns()) FROM items ORDER BY rowid")
                var exported: [(ItemClass, [UInt8], SecretBytes)] = []
                while try statement.step() {
                    let row = try SealedRow.read(from: statement)
                    if row.accessibility.isThisDeviceOnly {
                        summary.skippedThisDeviceOnly += 1
                        continue
                    }
                    if !row.accessControl.isEmpty {
                        summary.skippedAccessControlled += 1
                        continue
                    }
                    guard let classKey = try state.keys.classKey(for: row.accessibility, header: state.header) else {
                        throw lockedError()
                    }
                    let prefix = row.associatedDataPrefix(vaultID: state.header.vaultID)
                    let valueKey = try row.openValueKey(classKey: classKey, prefix: prefix)
                    let attributes = try row.openAttributes(classKey: classKey, prefix: prefix)
                    let data = try row.openData(valueKey: valueKey, prefix: prefix)
                    if row.itemClass == .key && ManagedKeyValue.isNonExtractable(data) {
                        summary.skippedNonExtractableKeys += 1
                        continue
                    }
                    exported.append((row.itemClass, attributes.encoded(), data))
                }
                return exported
            }
        }
        summary.exported = items.count

        // The plaintext is assembled in guarded memory and never touches the disk.
        var encodedSize = 8
        for (itemClass, attributes, data) in items {
            encodedSize += 3 * 5 + itemClass.rawValue.utf8.count + attributes.count + data.count
        }
        let plaintext = SecretBytes(capacity: encodedSize) { buffer in
            var offset = 0
            func append(_ bytes: UnsafeRawBufferPointer) {
                var length = UInt32(bytes.count).littleEndian
                withUnsafeBytes(of: &length) { UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + 4]).copyMemory(from: $0) }
                offset += 4
                if bytes.count > 0 {
                    UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + bytes.count]).copyMemory(from: bytes)
                }
                offset += bytes.count
            }
            var count = UInt64(items.count).littleEndian
            withUnsafeBytes(of: &count) { UnsafeMutableRawBufferPointer(rebasing: buffer[0..<8]).copyMemory(from: $0) }
            offset = 8
            for (itemClass, attributes, data) in items {
                Array(itemClass.rawValue.utf8).withUnsafeBytes { append($0) }
                attributes.withUnsafeBytes { append($0) }
                data.withUnsafeBytes { append($0) }
            }
            return offset
        }
        let derivation = configuration.keyDerivation.parameters
        guard let key = try derivation.deriveKey(from: passphrase) else {
            throw LockboxError(.io, "Not enough memory to derive the backup key (Argon2id).")
        }
        let header = Self.backupMagic + [Self.backupVersion] + derivation.encoded()
        var file = header
        var length = UInt32(derivation.encoded().count).littleEndian
        file.insert(contentsOf: withUnsafeBytes(of: &length) { Array($0) }, at: Self.backupMagic.count + 1)
        file += Crypto.seal(plaintext, key: key, associatedData: file)
        if replacing {
            try Self.checkBackupTarget(path, replacing: true)
            try Self.writeAtomically(file, to: path)
        } else {
            try Self.writeAtomically(file, to: path, replacing: false)
        }
        return summary
    }

    /// Refuses a backup's `path` that holds a file (with `replacing`, one that is not a Lockbox
    /// backup); a path with nothing there passes.
    public static func checkBackupTarget(_ path: String, replacing: Bool) throws(LockboxError) {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            guard errno == ENOENT else {
                throw LockboxError(.io, "Cannot write the backup \(path): \(String(cString: strerror(errno))).", cause: .systemCall("lstat", errno: errno))
            }
            return
        }
        guard replacing else { throw backupTargetExists(path) }
        let descriptor = Glibc.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        var start = [UInt8](repeating: 0, count: backupMagic.count)
        var read = -1
        if descriptor >= 0 {
            var regular = stat()
            if fstat(descriptor, &regular) == 0 && regular.st_mode & S_IFMT == S_IFREG {
                read = start.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            }
            close(descriptor)
        }
        guard read == backupMagic.count, start == backupMagic else {
            throw LockboxError(
                .param,
                "\(path) is not a Lockbox backup, so it is not replaced (--replace replaces only an earlier backup); nothing was "
                    + "written. Choose another file name.")
        }
    }

    static func backupTargetExists(_ path: String) -> LockboxError {
        LockboxError(
            .duplicateItem,
            "A file already exists at \(path); nothing was written. Choose another file name, or, to replace an earlier "
                + "backup, add --replace.")
    }

    /// Restores a backup made by ``backup(to:passphrase:)`` into this vault (unlocked).
    /// - Throws: `authFailed` for a wrong backup passphrase; `decode` for a damaged file.
    public func restore(from path: String, passphrase: SecretBytes) throws(LockboxError) -> RestoreSummary {
        guard let file = FileManager.default.contents(atPath: path).map(Array.init) else {
            throw LockboxError(.noSuchKeychain, "Cannot read the backup \(path).")
        }
        let items = try Self.openBackup(file, passphrase: passphrase)
        var summary = RestoreSummary(added: 0, replaced: 0, kept: 0)
        try withState { state throws(LockboxError) in
            guard try state.keys.currentMaster() != nil else { throw lockedError() }
            try writeRows(state) { writer throws(LockboxError) in
                for (itemClass, attributes, data) in items {
                    guard let accessibility = attributes.accessibility, !accessibility.isThisDeviceOnly else {
                        throw LockboxError.integrity("The backup \(path)")
                    }
                    let keys = try keysForWriting(itemClass, accessibility, state: state)
                    let digest = Crypto.keyedDigest(PrimaryKey.encode(itemClass, attributes), key: keys.indexKey)
                    let lookup = Crypto.keyedDigest(PrimaryKey.encode(itemClass, attributes, includingGroup: false), key: keys.indexKey)
                    // The row of the same primary key, its digest compared as bytes (as the
                    // writer's check compares it, whatever type the column holds).
                    let existing = try state.database.statement("SELECT \(SealedRow.columns()) FROM items WHERE lookup_digest = ?")
                    existing.bind(1, lookup)
                    var found: SealedRow?
                    while found == nil, try existing.step() {
                        let row = try SealedRow.read(from: existing)
                        if row.primaryDigest == digest { found = row }
                    }
                    existing.reset()
                    if let row = found {
                        guard row.isInItsBucket else { throw LockboxError.integrity("The keychain's rows") }
                        try verifyBuckets([row.bucket], state: state)
                        var current: Date?
                        if row.accessControl.isEmpty,
                            let classKey = try state.keys.classKey(for: row.accessibility, header: state.header)
                        {
                            let prefix = row.associatedDataPrefix(vaultID: state.header.vaultID)
                            let opened = try row.openAttributes(classKey: classKey, prefix: prefix)
                            // The row's digest must stand for the backup item's primary key.
                            // Compared as encoded (byte for byte), not as Swift strings.
                            guard PrimaryKey.encode(itemClass, opened, includingGroup: false)
                                == PrimaryKey.encode(itemClass, attributes, includingGroup: false),
                                row.itemClass == itemClass
                            else { throw LockboxError.integrity() }
                            current = opened.modificationDate
                        }
                        // Access-controlled or unreadable existing items are never overwritten.
                        guard row.accessControl.isEmpty, let current,
                            let incoming = attributes.modificationDate, incoming > current
                        else {
                            summary.kept += 1
                            continue
                        }
                        let sealed = SealedRow.seal(
                            id: row.id, itemClass: itemClass, attributes: attributes, data: data, classKey: keys.classKey,
                            indexKey: keys.indexKey, vaultID: state.header.vaultID, deviceID: state.device.identifier,
                            accessControl: nil, presencePublicKey: nil, version: writer.generation)
                        try writer.replace(row, with: sealed)
                        summary.replaced += 1
                    } else {
                        let sealed = SealedRow.seal(
                            id: SealedRow.newIdentifier(generation: writer.generation), itemClass: itemClass, attributes: attributes, data: data,
                            classKey: keys.classKey, indexKey: keys.indexKey, vaultID: state.header.vaultID,
                            deviceID: state.device.identifier, accessControl: nil, presencePublicKey: nil, version: writer.generation)
                        try writer.insert(sealed)
                        summary.added += 1
                    }
                }
            }
        }
        return summary
    }

    /// Parses and opens a backup file. Any damage is `errSecDecode`; a wrong passphrase is
    /// `errSecAuthFailed`.
    static func openBackup(_ file: [UInt8], passphrase: SecretBytes) throws(LockboxError) -> [(ItemClass, ItemAttributes, SecretBytes)] {
        let damaged = LockboxError.integrity("The backup file")
        let magic = backupMagic.count
        guard file.count > magic + 5, Array(file[0..<magic]) == backupMagic, file[magic] == backupVersion else {
            throw LockboxError(.decode, "This is not a Lockbox backup file (or one from a newer Lockbox).")
        }
        let lengthBytes = file[(magic + 1)..<(magic + 5)]
        let length = lengthBytes.enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        let parametersEnd = magic + 5 + length
        guard length > 0, parametersEnd < file.count,
            let derivation = PassphraseKeyDerivation(decoding: Array(file[(magic + 5)..<parametersEnd]))
        else { throw damaged }
        guard derivation.meetsMinimum else {
            throw LockboxError(.decode, "The backup's key-derivation parameters are below Lockbox's minimum: the file was modified.")
        }
        guard let key = try derivation.deriveKey(from: passphrase) else {
            throw LockboxError(.io, "Not enough memory to derive the backup key (Argon2id).")
        }
        guard let plaintext = try? Crypto.open(Array(file[parametersEnd...]), key: key, associatedData: Array(file[0..<parametersEnd])) else {
            throw LockboxError(.authFailed, "The backup passphrase is wrong, or the backup file is damaged.")
        }
        return try plaintext.withUnsafeBytes { (bytes: UnsafeRawBufferPointer) throws(LockboxError) in try decodeBackupItems(bytes) }
    }

    /// The items of an opened (authenticated) backup payload. Any damage is `errSecDecode`.
    static func decodeBackupItems(_ bytes: UnsafeRawBufferPointer) throws(LockboxError) -> [(ItemClass, ItemAttributes, SecretBytes)] {
        let damaged = LockboxError.integrity("The backup file")
        guard bytes.count >= 8 else { throw damaged }
        var count = 0
        for index in 0..<8 { count |= Int(bytes[index]) << (8 * index) }
        // The top bit makes the count negative, and `0..<count` would trap (found by fuzzing).
        guard count >= 0 else { throw damaged }
        var offset = 8
        func field() throws(LockboxError) -> UnsafeRawBufferPointer {
            guard bytes.count - offset >= 4 else { throw damaged }
            var length = 0
            for index in 0..<4 { length |= Int(bytes[offset + index]) << (8 * index) }
            offset += 4
            guard length <= bytes.count - offset else { throw damaged }
            defer { offset += length }
            return UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + length])
        }
        var items: [(ItemClass, ItemAttributes, SecretBytes)] = []
        for _ in 0..<count {
            guard let itemClass = ItemClass(rawValue: String(decoding: try field(), as: UTF8.self)),
                let attributes = try? ItemAttributes(decoding: Array(try field()))
            else { throw damaged }
            items.append((itemClass, attributes, SecretBytes(copying: try field())))
        }
        guard offset == bytes.count else { throw damaged }
        return items
    }

    /// Writes `bytes` to a new file beside `path` and renames it into place. The temporary
    /// file has an unpredictable name and is created exclusively without following links
    /// (`O_EXCL | O_NOFOLLOW`), so nobody can plant it or a symlink in its place beforehand.
    /// `what` names the file in errors ("the backup"). With `replacing` false, a file at `path`
    /// (even one made while this one was written) is not replaced: `duplicateItem`.
    /// With `synced` false, the file is not synced before it is moved into place (a record that
    /// may lag after a power loss, never run ahead). With `removingLeftovers`, what earlier writes
    /// of `path` that stopped before their rename left beside it is removed first, once a minute
    /// old (a younger one may be another process's write in flight); a file Lockbox rewrites
    /// often (a record of its own) asks for it, never a backup at a path the user chose.
    package static func writeAtomically(
        _ bytes: [UInt8], to path: String, what: String = "the backup", synced: Bool = true, removingLeftovers: Bool = false,
        replacing: Bool = true
    ) throws(LockboxError) {
        if removingLeftovers { removeLeftovers(of: path) }
        let temporary = path + partialSuffix + Crypto.randomBytes(8).hexString
        let descriptor = Glibc.open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw LockboxError(.io, "Cannot write \(what) \(path): \(String(cString: strerror(errno))).")
        }
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress! + offset, bytes.count - offset) }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else {
                close(descriptor)
                unlink(temporary)
                throw LockboxError(.io, "Writing \(what) \(path) failed (disk full?); nothing was written.")
            }
            offset += written
        }
        guard !synced || fsync(descriptor) == 0 else {
            close(descriptor)
            unlink(temporary)
            throw LockboxError(.io, "Writing \(what) \(path) failed (fsync: \(String(cString: strerror(errno)))); nothing was written.")
        }
        close(descriptor)
        if !replacing {
            // Never over a file that appeared meanwhile.
            let placed: Bool
            do {
                placed = try placeWithoutReplacing(temporary, path)
            } catch {
                unlink(temporary)
                throw error
            }
            guard placed else {
                unlink(temporary)
                throw backupTargetExists(path)
            }
        } else if rename(temporary, path) != 0 {
            unlink(temporary)
            throw LockboxError(.io, "Cannot move \(what) into place at \(path).")
        }
        // The rename itself is kept by a sync of the directory; without it a power loss may
        // bring back the file it replaced. Best effort: the file is in place either way.
        if synced {
            let directory = Glibc.open(FilePermissions.directory(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if directory >= 0 {
                fsync(directory)
                close(directory)
            }
        }
    }

    /// What ``writeAtomically(_:to:what:synced:removingLeftovers:)`` names its temporary file:
    /// the path, this, and 16 hexadecimal digits.
    private static let partialSuffix = ".partial-"

    /// Removes the temporary files of writes of `path` stopped before their rename, once a
    /// minute old. Best effort: a leftover not removed costs only its few bytes.
    private static func removeLeftovers(of path: String) {
        let directory = FilePermissions.directory(of: path)
        let prefix = String(path.split(separator: "/").last ?? "") + partialSuffix
        guard let stream = opendir(directory) else { return }
        defer { closedir(stream) }
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        while let entry = readdir(stream) {
            let name = DirectoryEntry.name(entry)
            guard name.hasPrefix(prefix), name.count == prefix.count + 16,
                name.dropFirst(prefix.count).allSatisfy({ $0.isHexDigit })
            else { continue }
            let leftover = (directory == "/" ? "" : directory) + "/" + name
            var info = stat()
            guard lstat(leftover, &info) == 0, info.st_mode & S_IFMT == S_IFREG, now.tv_sec - info.st_mtim.tv_sec > 60 else { continue }
            unlink(leftover)
        }
    }
}
