/// The four Keychain item classes (`kSecClass`).
public enum ItemClass: String, Sendable, Hashable, CaseIterable, Codable {
    /// `kSecClassGenericPassword`: primary key service + account.
    case genericPassword
    /// `kSecClassInternetPassword`: primary key server, protocol, port, path, account,
    /// authentication type and security domain.
    case internetPassword
    /// `kSecClassKey`: primary key key class, type, size, application label and tag.
    case key
    /// `kSecClassCertificate`: primary key certificate type, issuer and serial number.
    case certificate
}

/// When an item can be read, Apple's `kSecAttrAccessible*` values.
///
/// On Linux, "unlocked" means the vault is unlocked (its master key is in the kernel keyring or
/// in this process), and "after first unlock" means the vault has been unlocked at least once
/// since the machine booted. `*ThisDeviceOnly` items never leave this machine: they are left
/// out of backups and cannot be opened from a copied vault file.
public enum Accessibility: String, Sendable, Hashable, CaseIterable, Codable {
    /// Readable only while the vault is unlocked. Apple's default, and Lockbox's.
    case whenUnlocked
    /// Readable from the first unlock after boot until the next reboot, also while locked.
    case afterFirstUnlock
    /// As `whenUnlocked`, and never migrates to another machine.
    case whenUnlockedThisDeviceOnly
    /// As `afterFirstUnlock`, and never migrates. Recommended for refresh tokens that a
    /// background service must read while the user's session is locked.
    case afterFirstUnlockThisDeviceOnly
    /// Only while a passphrase is set; removing the last passphrase deletes these items.
    case whenPasscodeSetThisDeviceOnly
    /// Deprecated by Apple and the weakest class: readable whenever the file is readable.
    case always
    /// Deprecated by Apple: as `always`, bound to this machine.
    case alwaysThisDeviceOnly

    /// Apple's default for new items.
    public static let `default` = Accessibility.whenUnlocked

    /// True for the classes that never leave this machine.
    public var isThisDeviceOnly: Bool {
        switch self {
        case .whenUnlockedThisDeviceOnly, .afterFirstUnlockThisDeviceOnly,
            .whenPasscodeSetThisDeviceOnly, .alwaysThisDeviceOnly:
            true
        case .whenUnlocked, .afterFirstUnlock, .always:
            false
        }
    }

    /// When the class key is available.
    public var availability: Availability {
        switch self {
        case .whenUnlocked, .whenUnlockedThisDeviceOnly, .whenPasscodeSetThisDeviceOnly: .whileUnlocked
        case .afterFirstUnlock, .afterFirstUnlockThisDeviceOnly: .afterFirstUnlock
        case .always, .alwaysThisDeviceOnly: .always
        }
    }

    /// The three lock levels a class key can belong to.
    public enum Availability: Sendable, Hashable {
        /// Only while the vault is unlocked (`whenUnlocked*`).
        case whileUnlocked
        /// From the first unlock after boot until reboot (`afterFirstUnlock*`).
        case afterFirstUnlock
        /// Whenever the file can be read (`always*`).
        case always
    }

    /// Parses Apple's names, with or without the `kSecAttrAccessible` prefix
    /// (`afterFirstUnlockThisDeviceOnly`, `kSecAttrAccessibleWhenUnlocked`).
    public init?(name: String) {
        var name = name
        let prefix = "kSecAttrAccessible"
        if name.hasPrefix(prefix) {
            name = String(name.dropFirst(prefix.count))
            guard let first = name.first else { return nil }
            name = first.lowercased() + name.dropFirst()
        }
        self.init(rawValue: name)
    }
}
