#if !canImport(Darwin)
import Foundation
import LockboxCore

/// Reads the loosely typed values of a query dictionary the way Security.framework does:
/// `Bool` or `NSNumber` for booleans, `String` or `NSString` for strings, and so on.
/// `value as Any` of an optional (as in `accessControl as Any`) is looked through.
enum QueryValue {
    static func unwrapped(_ value: Any) -> Any? {
        if let optional = value as? any OptionalUnwrapping { return optional.unwrappedValue }
        return value
    }

    static func string(_ value: Any) -> String? {
        unwrapped(value).flatMap { $0 as? String }
    }

    static func bool(_ value: Any) -> Bool? {
        guard let value = unwrapped(value) else { return nil }
        if let flag = value as? Bool { return flag }
        if let number = integer(value) { return number != 0 }
        return nil
    }

    static func integer(_ value: Any) -> Int? {
        guard let value = unwrapped(value) else { return nil }
        // A Swift `true` is not a number here; an NSNumber is, whatever it holds.
        if type(of: value) == Bool.self { return nil }
        if let number = value as? any BinaryInteger { return Int(exactly: number) }
        if let number = value as? NSNumber { return number.intValue }
        if let text = value as? String { return Int(text) }
        return nil
    }

    static func data(_ value: Any) -> Data? {
        unwrapped(value).flatMap { $0 as? Data }
    }

    static func date(_ value: Any) -> Date? {
        unwrapped(value).flatMap { $0 as? Date }
    }
}

protocol OptionalUnwrapping {
    var unwrappedValue: Any? { get }
}

extension Optional: OptionalUnwrapping {
    var unwrappedValue: Any? {
        switch self {
        case .none: nil
        case .some(let wrapped): QueryValue.unwrapped(wrapped)
        }
    }
}

/// The `kSecAttrAccessible*` codes (`ak`, `cku`, ...) and the Lockbox classes they name.
enum AccessibilityCode {
    static let byCode: [String: Accessibility] = Dictionary(uniqueKeysWithValues: ([
        kSecAttrAccessibleWhenUnlocked: .whenUnlocked,
        kSecAttrAccessibleAfterFirstUnlock: .afterFirstUnlock,
        kSecAttrAccessibleAlways: .always,
        kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly: .whenPasscodeSetThisDeviceOnly,
        kSecAttrAccessibleWhenUnlockedThisDeviceOnly: .whenUnlockedThisDeviceOnly,
        kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: .afterFirstUnlockThisDeviceOnly,
        kSecAttrAccessibleAlwaysThisDeviceOnly: .alwaysThisDeviceOnly,
    ] as [CFString: Accessibility]).map { ($0.key as String, $0.value) })

    static func accessibility(for code: String) -> Accessibility? { byCode[code] }

    static func code(for accessibility: Accessibility) -> String {
        byCode.first { $0.value == accessibility }!.key
    }
}

/// The `kSecClass` values and Lockbox's item classes.
enum ItemClassCode {
    static func itemClass(for code: String) -> ItemClass? {
        switch code {
        case kSecClassGenericPassword: .genericPassword
        case kSecClassInternetPassword: .internetPassword
        case kSecClassKey: .key
        case kSecClassCertificate: .certificate
        default: nil
        }
    }

    static func code(for itemClass: ItemClass) -> String {
        switch itemClass {
        case .genericPassword: kSecClassGenericPassword as String
        case .internetPassword: kSecClassInternetPassword as String
        case .key: kSecClassKey as String
        case .certificate: kSecClassCertificate as String
        }
    }
}

/// `kSecAttrKeyClass` values: Apple's "0", "1", "2".
enum KeyClassCode {
    static func keyClass(for code: String) -> KeyClass? {
        switch code {
        case kSecAttrKeyClassPublic: .public
        case kSecAttrKeyClassPrivate: .private
        case kSecAttrKeyClassSymmetric: .symmetric
        default: nil
        }
    }

    static func code(for keyClass: KeyClass) -> String {
        switch keyClass {
        case .public: kSecAttrKeyClassPublic as String
        case .private: kSecAttrKeyClassPrivate as String
        case .symmetric: kSecAttrKeyClassSymmetric as String
        }
    }
}
#endif
