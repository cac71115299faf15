import LockboxCore
import VaultCrypto

/// Where each class key is kept in the header and what wraps it.
///
/// - Portable classes (`whenUnlocked`, `afterFirstUnlock`): one entry (device ""), wrapped by
///   the master key.
/// - `*ThisDeviceOnly` classes: one entry per machine (its device identifier), wrapped by the
///   master key bound to that machine's device secret.
/// - `always` (header version 2): wrapped by the master key (device ""), so it moves with the
///   file, and once more per machine by that machine's device key (device "v2:ID"), so it can be
///   read before the first unlock. `alwaysThisDeviceOnly`: only the per-machine copy.
///   Nobody without the master key or this machine's device key can make a class key that the
///   vault accepts, so nobody else can seal a row it will serve.
/// - A version-1 header wrapped the `always` classes with a key derived from the vault's
///   identity (which the file holds); those keys are replaced at the first unlock
///   (``Vault/upgradeRows``).
extension KeyCache {
    static let deviceEntryPrefix = "v2:"

    /// The master-wrapped entry of a class (nil when there is none).
    static func masterEntry(_ accessibility: Accessibility, device: DeviceSecret, header: VaultHeader) -> VaultHeader.ClassKeyID? {
        if header.version >= 2 && accessibility == .alwaysThisDeviceOnly { return nil }
        return VaultHeader.ClassKeyID(accessibility: accessibility, device: accessibility.isThisDeviceOnly ? device.identifier : "")
    }

    /// The device-wrapped entry of an `always` class on this machine (header version 2).
    static func deviceEntry(_ accessibility: Accessibility, device: DeviceSecret, header: VaultHeader) -> VaultHeader.ClassKeyID? {
        guard header.version >= 2, accessibility.availability == .always else { return nil }
        return VaultHeader.ClassKeyID(accessibility: accessibility, device: deviceEntryPrefix + device.identifier)
    }

    /// Whether `id` is wrapped the version-1 way (by the vault identity).
    static func isLegacyAlways(_ id: VaultHeader.ClassKeyID, header: VaultHeader) -> Bool {
        guard id.accessibility.availability == .always, !id.device.hasPrefix(deviceEntryPrefix) else { return false }
        return header.version == 1 || id.accessibility == .alwaysThisDeviceOnly
    }

    /// Nil when this machine's device secret is unavailable (a TPM that does not unseal it).
    static func deviceWrappingKey(device: DeviceSecret, header: VaultHeader) -> SecretBytes? {
        guard let secret = device.availableSecret else { return nil }
        return Crypto.combine(secret, with: SecretBytes(copying: header.vaultID), context: "lockbox.device-wrap.v2")
    }

    /// The key that wraps entry `id`, if it can be had: the master key (bound to the device
    /// secret for `*ThisDeviceOnly`), this machine's device key for a "v2:" entry, or for a
    /// version-1 `always` entry the vault identity.
    static func wrappingKey(
        for id: VaultHeader.ClassKeyID, master: SecretBytes?, device: DeviceSecret, header: VaultHeader
    ) -> SecretBytes? {
        if id.device.hasPrefix(deviceEntryPrefix) {
            guard id.device == deviceEntryPrefix + device.identifier else { return nil }
            return deviceWrappingKey(device: device, header: header)
        }
        let base: SecretBytes
        if isLegacyAlways(id, header: header) {
            var identity = header.vaultID
            identity += [UInt8](repeating: 0, count: max(0, Crypto.keyByteCount - identity.count))
            base = Crypto.deriveKey(from: SecretBytes(copying: identity), context: "lbxalway", identifier: 1)
        } else {
            guard let master else { return nil }
            base = master
        }
        guard id.accessibility.isThisDeviceOnly else { return base }
        guard let secret = device.availableSecret else { return nil }
        return Crypto.combine(base, with: secret, context: "lockbox.this-device-only.v1")
    }

    static func openEntry(_ id: VaultHeader.ClassKeyID, header: VaultHeader, wrappingKey: SecretBytes) -> SecretBytes? {
        guard let wrapped = header.wrappedClassKeys[id],
            let key = try? Crypto.open(wrapped, key: wrappingKey, associatedData: header.classKeyAssociatedData(id)),
            key.count == Crypto.keyByteCount
        else { return nil }
        return key
    }

    /// Unwraps a class key: nil when its wrapping key is unavailable or when this machine has
    /// no key of that class yet; `errSecDecode` when the stored key fails to open.
    ///
    /// The version-1 wrapping of the `always` classes (by the vault identity, which the file
    /// holds) is used only when `allowingVersion1` is set: by the upgrade, after the header was
    /// verified with the master key. Anywhere else such an entry is no key at all, so a header
    /// edited back to version 1 cannot hand out a key computed from the file.
    static func unwrapClassKey(
        _ accessibility: Accessibility, header: VaultHeader, master: SecretBytes?, device: DeviceSecret,
        previousMasters: [SecretBytes] = [], allowingVersion1: Bool = false
    ) throws(LockboxError) -> SecretBytes? {
        var candidates: [VaultHeader.ClassKeyID] = []
        if let id = deviceEntry(accessibility, device: device, header: header), header.wrappedClassKeys[id] != nil {
            candidates.append(id)
        }
        if let id = masterEntry(accessibility, device: device, header: header), header.wrappedClassKeys[id] != nil {
            candidates.append(id)
        }
        if header.version >= 2 && accessibility == .alwaysThisDeviceOnly {
            // A version-1 entry of this machine, not yet replaced.
            let legacy = VaultHeader.ClassKeyID(accessibility: accessibility, device: device.identifier)
            if header.wrappedClassKeys[legacy] != nil { candidates.append(legacy) }
        }
        for id in candidates {
            if isLegacyAlways(id, header: header) && !allowingVersion1 { continue }
            guard let wrappingKey = wrappingKey(for: id, master: master, device: device, header: header) else { continue }
            if let key = openEntry(id, header: header, wrappingKey: wrappingKey) { return key }
            // Wrapped by an earlier master key (the passphrase changed on another machine).
            if !id.device.hasPrefix(deviceEntryPrefix), !isLegacyAlways(id, header: header) {
                for previous in previousMasters {
                    if let older = Self.wrappingKey(for: id, master: previous, device: device, header: header),
                        let key = openEntry(id, header: header, wrappingKey: older)
                    {
                        return key
                    }
                }
            }
            throw LockboxError.integrity("The \(accessibility.rawValue) class key")
        }
        // Every keychain has each portable class's key under its master key from its creation:
        // with the master key at hand, none is a key removed from the file, not a locked class.
        if master != nil && !accessibility.isThisDeviceOnly && candidates.isEmpty {
            throw LockboxError.integrity("The \(accessibility.rawValue) class key")
        }
        return nil
    }

    static func seal(_ key: SecretBytes, as id: VaultHeader.ClassKeyID, in header: inout VaultHeader, master: SecretBytes, device: DeviceSecret) {
        guard let wrappingKey = wrappingKey(for: id, master: master, device: device, header: header) else {
            preconditionFailure("a class key is sealed only with its wrapping key at hand")
        }
        header.wrappedClassKeys[id] = Crypto.seal(key, key: wrappingKey, associatedData: header.classKeyAssociatedData(id))
    }

    /// Adds fresh class keys for every class this machine lacks (all of them for a new vault;
    /// the `*ThisDeviceOnly` ones and the device copy of `always` when a vault is first unlocked
    /// on another machine). `whenPasscodeSetThisDeviceOnly` exists only while a passphrase does.
    static func addMissingClassKeys(to header: inout VaultHeader, master: SecretBytes, device: DeviceSecret) throws(LockboxError) -> Bool {
        var added = false
        for accessibility in Accessibility.allCases {
            if accessibility == .whenPasscodeSetThisDeviceOnly && !header.hasPassphrase { continue }
            // Without this machine's device secret nothing bound to it can be made (or read).
            if device.availableSecret == nil && (accessibility.isThisDeviceOnly || accessibility.availability == .always) { continue }
            var key: SecretBytes?
            if let id = masterEntry(accessibility, device: device, header: header) {
                if header.wrappedClassKeys[id] == nil {
                    let fresh = Crypto.generateKey()
                    seal(fresh, as: id, in: &header, master: master, device: device)
                    key = fresh
                    added = true
                }
            }
            if let id = deviceEntry(accessibility, device: device, header: header), header.wrappedClassKeys[id] == nil {
                // The same key as the master-wrapped copy, if there is one.
                var copy: SecretBytes
                if let key {
                    copy = key
                } else if let existing = try unwrapClassKey(accessibility, header: header, master: master, device: device) {
                    copy = existing
                } else {
                    copy = Crypto.generateKey()
                }
                seal(copy, as: id, in: &header, master: master, device: device)
                added = true
            }
        }
        return added
    }
}
