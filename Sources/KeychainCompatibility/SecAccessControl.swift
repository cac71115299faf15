#if !canImport(Darwin)
import Foundation
import LockboxCore

/// Constraints on reading an item: who must authenticate, and how.
///
/// The raw values are Apple's, so flags stored or logged by numeric value mean the same thing.
public struct SecAccessControlCreateFlags: OptionSet, Sendable, Hashable {
    public let rawValue: CFOptionFlags
    public init(rawValue: CFOptionFlags) { self.rawValue = rawValue }

    /// Biometry or the device passcode; on Linux, the vault passphrase.
    public static let userPresence = SecAccessControlCreateFlags(rawValue: 1 << 0)
    /// Any enrolled biometry. Linux has none: see ``SecAccessControl``.
    public static let biometryAny = SecAccessControlCreateFlags(rawValue: 1 << 1)
    /// The biometry enrolled now. Linux has none: see ``SecAccessControl``.
    public static let biometryCurrentSet = SecAccessControlCreateFlags(rawValue: 1 << 3)
    /// The device passcode; on Linux, the vault passphrase.
    public static let devicePasscode = SecAccessControlCreateFlags(rawValue: 1 << 4)
    /// A paired watch (macOS). Linux has none.
    public static let watch = SecAccessControlCreateFlags(rawValue: 1 << 5)
    /// A paired companion device. Linux has none.
    public static let companion = SecAccessControlCreateFlags(rawValue: 1 << 5)
    /// Any one of the constraints suffices.
    public static let or = SecAccessControlCreateFlags(rawValue: 1 << 14)
    /// Every constraint must be met (the default with several constraints).
    public static let and = SecAccessControlCreateFlags(rawValue: 1 << 15)
    /// Private-key operations (Secure Enclave keys).
    public static let privateKeyUsage = SecAccessControlCreateFlags(rawValue: 1 << 30)
    /// An application-supplied password protects the item.
    public static let applicationPassword = SecAccessControlCreateFlags(rawValue: 1 << 31)

    @available(*, deprecated, renamed: "biometryAny")
    public static let touchIDAny = biometryAny
    @available(*, deprecated, renamed: "biometryCurrentSet")
    public static let touchIDCurrentSet = biometryCurrentSet
}

/// An item's access control: its protection class and the authentication its use needs.
///
/// Made by ``SecAccessControlCreateWithFlags(_:_:_:_:)`` and passed as the value of
/// ``kSecAttrAccessControl``. Equal (and hashing equal) when protection and flags are, as
/// CF objects compare on Apple platforms (docs/SECITEM.md, "Access control and biometry"):
/// - `userPresence` and `devicePasscode` store the item sealed to the passphrase: each read asks
///   through `kSecUseAuthenticationContext` (an `LAContext`);
/// - biometry (`biometryAny`, `biometryCurrentSet`, `watch`) cannot be satisfied on Linux, and
///   adding such an item fails with `errSecAuthFailed`, as on an Apple device without
///   enrolled biometry;
/// - `applicationPassword` fails with `errSecUnimplemented` rather than store an item that any
///   caller could read unverified.
public final class SecAccessControl: Sendable, Hashable, CustomStringConvertible {
    /// The protection class (`kSecAttrAccessible*` value).
    public let protection: Accessibility
    /// The constraints.
    public let flags: SecAccessControlCreateFlags

    init(protection: Accessibility, flags: SecAccessControlCreateFlags) {
        self.protection = protection
        self.flags = flags
    }

    public static func == (lhs: SecAccessControl, rhs: SecAccessControl) -> Bool {
        lhs.protection == rhs.protection && lhs.flags == rhs.flags
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(protection)
        hasher.combine(flags.rawValue)
    }

    public var description: String {
        "SecAccessControl(protection: \(protection.rawValue), flags: 0x\(String(flags.rawValue, radix: 16)))"
    }
}

/// Creates an access-control object for ``kSecAttrAccessControl``.
///
/// ```swift
/// let access = SecAccessControlCreateWithFlags(
///     nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .userPresence, nil)
/// ```
/// - Parameters:
///   - allocator: Ignored; pass `nil` or ``kCFAllocatorDefault``.
///   - protection: One of the `kSecAttrAccessible*` values.
///   - flags: The constraints.
///   - error: On failure, receives an `NSError` in `NSOSStatusErrorDomain` with code
///     `errSecParam`.
/// - Returns: The object, or nil when `protection` is not an accessibility value or `flags`
///   combine `.or` with `.and`.
public func SecAccessControlCreateWithFlags(
    _ allocator: CFAllocator?, _ protection: Any, _ flags: SecAccessControlCreateFlags,
    _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> SecAccessControl? {
    guard let name = QueryValue.string(protection), let accessibility = AccessibilityCode.accessibility(for: name),
        !flags.isSuperset(of: [.or, .and])
    else {
        error?.pointee = Unmanaged.passRetained(
            NSError(domain: "NSOSStatusErrorDomain", code: Int(errSecParam), userInfo: [
                NSLocalizedDescriptionKey: "SecAccessControlCreateWithFlags: invalid protection or flags"
            ]))
        return nil
    }
    return SecAccessControl(protection: accessibility, flags: flags)
}

extension SecAccessControl {
    /// What adding an item with this access control amounts to on Linux today.
    var linuxRequirement: LinuxRequirement {
        let unavailable: SecAccessControlCreateFlags = [.biometryAny, .biometryCurrentSet, .watch]
        let verification: SecAccessControlCreateFlags = [.userPresence, .devicePasscode]
        let constraints = flags.intersection(unavailable.union(verification))
        var satisfiable = constraints.subtracting(unavailable)
        if flags.contains(.applicationPassword) { satisfiable.insert(.applicationPassword) }
        let unsatisfiable = !constraints.intersection(unavailable).isEmpty
        // With `.or`, one satisfiable constraint is enough; otherwise every one must be.
        if unsatisfiable && (!flags.contains(.or) || satisfiable.isEmpty) {
            return .unavailableHardware
        }
        return satisfiable.isEmpty ? .none : .userVerification
    }

    enum LinuxRequirement {
        /// No authentication needed beyond the protection class.
        case none
        /// The passphrase (or an application password) must be entered for each use.
        case userVerification
        /// Only hardware Linux does not have can satisfy the constraints.
        case unavailableHardware
    }
}
#endif
