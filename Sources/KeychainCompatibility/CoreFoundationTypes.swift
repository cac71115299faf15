#if !canImport(Darwin)
// Keychain code uses Data and friends after `import Security` alone; so it may here.
@_exported import Foundation

// Foundation on Linux does not export CoreFoundation's types. These aliases name the Foundation
// classes that CoreFoundation's types are toll-free bridged to on Apple platforms, and Swift on
// Linux bridges those classes to the Swift value types with `as`, as it does on Apple platforms:
//
//     let query: [String: AnyObject] = [
//         kSecClass as String: kSecClassGenericPassword,     // a CFString is an object
//         kSecReturnData as String: kCFBooleanTrue,
//     ]
//     var item: CFTypeRef?
//     let status = SecItemCopyMatching(query as CFDictionary, &item)
//     let data = item as? Data
//
// Results are Foundation objects (NSData, NSDictionary, NSArray) behind `AnyObject`, exactly
// what `as? Data`, `as? [String: Any]` and `as? [[String: Any]]` expect.
// A program that also imports CoreFoundation gets CoreFoundation's own `CFDictionary` too:
// qualify these names (`KeychainCompatibility.CFDictionary`) or drop that import.

/// A status code: `errSecSuccess` (0) or one of the `errSec*` errors.
public typealias OSStatus = Int32

/// `noErr`: the generic "no error" status (MacTypes.h), equal to `errSecSuccess`.
public let noErr: OSStatus = 0

/// Any object a SecItem function returns through its `result` pointer.
public typealias CFTypeRef = AnyObject

/// A query or attribute dictionary: any Swift dictionary converts with `as CFDictionary`
/// (`[String: Any]`, `[String: AnyObject]`, `[CFString: Any]`, `[String?: AnyObject]`).
public typealias CFDictionary = NSDictionary

/// The type of every `kSec*` key and value: an object, so it goes into `[String: AnyObject]`
/// as is, and `kSecClass as String` gives the Swift string.
public typealias CFString = NSString

/// Item data, persistent references and key representations (`data as CFData`, `cfData as Data`).
public typealias CFData = NSData

/// Results of a search with `kSecMatchLimitAll`.
public typealias CFArray = NSArray

/// Booleans in a query, `kCFBooleanTrue`: Swift's `true` and `false` work as well.
public typealias CFBoolean = NSNumber

/// Numbers in a query (`kSecAttrPort`, `kSecMatchLimit` as a count).
public typealias CFNumber = NSNumber

/// `CFIndex`, CoreFoundation's signed length type.
public typealias CFIndex = Int

/// `CFTypeID`: the type of a CoreFoundation object (see ``CFGetTypeID(_:)``).
public typealias CFTypeID = UInt

/// `CFOptionFlags`, the raw type of ``SecAccessControlCreateFlags``.
public typealias CFOptionFlags = UInt

/// The error `SecAccessControlCreateWithFlags` and the `SecKey` functions report through their
/// `error` pointer: `error!.takeRetainedValue() as Error` works as on Apple platforms.
public typealias CFError = NSError

/// `CFErrorDomain`.
public typealias CFErrorDomain = CFString

/// Stands in for CoreFoundation's allocator parameter, which Lockbox ignores: pass `nil`,
/// ``kCFAllocatorDefault`` or ``kCFAllocatorNull``.
public final class CFAllocator: Sendable {
    private init() {}
}

/// The default allocator: `nil`, as every SecItem call may take.
public let kCFAllocatorDefault: CFAllocator? = nil

/// The "do not free" allocator of ``CFDataCreateWithBytesNoCopy(_:_:_:_:)``: `nil` here, since
/// the bytes are always copied.
public let kCFAllocatorNull: CFAllocator? = nil

/// `kCFBooleanTrue`, an implicitly unwrapped optional as Apple's overlay imports it.
public let kCFBooleanTrue: CFBoolean! = NSNumber(value: true)

/// `kCFBooleanFalse`.
public let kCFBooleanFalse: CFBoolean! = NSNumber(value: false)

// MARK: - CFError

/// The domain of an error from a Security function (`NSOSStatusErrorDomain` for statuses).
public func CFErrorGetDomain(_ error: CFError) -> CFErrorDomain! {
    error.domain as NSString
}

/// The error's code: the `OSStatus` for a Security error.
public func CFErrorGetCode(_ error: CFError) -> CFIndex {
    error.code
}

/// The error's user-info dictionary (`NSLocalizedDescription` holds the message).
public func CFErrorCopyUserInfo(_ error: CFError) -> CFDictionary! {
    error.userInfo as NSDictionary
}

/// The error's description, as `localizedDescription` gives it.
public func CFErrorCopyDescription(_ error: CFError) -> CFString! {
    error.localizedDescription as NSString
}

// MARK: - CFData and type identifiers

/// A data object holding `length` bytes from `bytes`. The bytes are copied, so the caller may
/// free them at once; the deallocator argument (often ``kCFAllocatorNull``) is not used.
public func CFDataCreateWithBytesNoCopy(
    _ allocator: CFAllocator?, _ bytes: UnsafePointer<UInt8>!, _ length: CFIndex, _ bytesDeallocator: CFAllocator?
) -> CFData! {
    guard length >= 0, length == 0 || bytes != nil else { return nil }
    return length == 0 ? NSData() : NSData(bytes: bytes, length: length)
}

/// A data object with a copy of `length` bytes from `bytes`.
public func CFDataCreate(_ allocator: CFAllocator?, _ bytes: UnsafePointer<UInt8>!, _ length: CFIndex) -> CFData! {
    CFDataCreateWithBytesNoCopy(allocator, bytes, length, nil)
}

/// The number of bytes in `data`.
public func CFDataGetLength(_ data: CFData) -> CFIndex { data.length }

/// The type of a CoreFoundation object: compare it with ``SecKeyGetTypeID()``,
/// ``CFDataGetTypeID()``, ``CFStringGetTypeID()``, ``CFDictionaryGetTypeID()``, ...
public func CFGetTypeID(_ object: CFTypeRef!) -> CFTypeID {
    guard let object else { return 0 }
    return TypeIdentifier.of(object)
}

/// The type identifier of data objects.
public func CFDataGetTypeID() -> CFTypeID { TypeIdentifier.data }
/// The type identifier of strings.
public func CFStringGetTypeID() -> CFTypeID { TypeIdentifier.string }
/// The type identifier of dictionaries.
public func CFDictionaryGetTypeID() -> CFTypeID { TypeIdentifier.dictionary }
/// The type identifier of arrays.
public func CFArrayGetTypeID() -> CFTypeID { TypeIdentifier.array }
/// The type identifier of booleans (`kCFBooleanTrue`).
public func CFBooleanGetTypeID() -> CFTypeID { TypeIdentifier.boolean }
/// The type identifier of numbers.
public func CFNumberGetTypeID() -> CFTypeID { TypeIdentifier.number }

/// Numbers chosen here (CoreFoundation's own vary between releases, and code only compares them).
enum TypeIdentifier {
    static let data: CFTypeID = 20
    static let string: CFTypeID = 7
    static let dictionary: CFTypeID = 18
    static let array: CFTypeID = 19
    static let boolean: CFTypeID = 21
    static let number: CFTypeID = 22
    static let key: CFTypeID = 90
    static let accessControl: CFTypeID = 91
    static let unknown: CFTypeID = 1

    static func of(_ object: AnyObject) -> CFTypeID {
        switch object {
        case is SecKey: key
        case is SecAccessControl: accessControl
        case let number as NSNumber: CFGetTypeIDOfNumber(number)
        case is NSData: data
        case is NSString: string
        case is NSDictionary: dictionary
        case is NSArray: array
        default:
            // A Swift value boxed by `as AnyObject` (Data, String, ...).
            switch object as Any {
            case is Data: data
            case is String: string
            case is Bool: boolean
            case is [AnyHashable: Any]: dictionary
            case is [Any]: array
            default: unknown
            }
        }
    }

    private static func CFGetTypeIDOfNumber(_ number: NSNumber) -> CFTypeID {
        String(cString: number.objCType) == "c" ? boolean : TypeIdentifier.number
    }
}
#endif
