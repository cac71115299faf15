#if !canImport(Security)
// Keychain code uses Data and friends after `import Security` alone; so it may here.
@_exported import Foundation

// Foundation on Linux does not export CoreFoundation's types, and Swift on Linux has no
// toll-free bridging. These aliases name the Swift types that Apple's overlay bridges the CF
// types to, so the usual spellings compile unchanged:
//
//     let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, ...]
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

/// Any object a SecItem function returns through its `result` pointer.
public typealias CFTypeRef = AnyObject

/// A query or attribute dictionary, written `[String: Any]`.
public typealias CFDictionary = [String: Any]

/// The type of every `kSec*` key and value: write `kSecClass as String`.
public typealias CFString = String

/// Item data and persistent references.
public typealias CFData = Data

/// Results of a search with `kSecMatchLimitAll`.
public typealias CFArray = [Any]

/// Booleans in a query: `true` and `false` work as well.
public typealias CFBoolean = Bool

/// Numbers in a query (`kSecAttrPort`, `kSecMatchLimit` as a count).
public typealias CFNumber = NSNumber

/// `CFOptionFlags`, the raw type of ``SecAccessControlCreateFlags``.
public typealias CFOptionFlags = UInt

/// The error `SecAccessControlCreateWithFlags` reports through its `error` pointer.
public typealias CFError = NSError

/// Stands in for CoreFoundation's allocator parameter, which Lockbox ignores: pass `nil`
/// or ``kCFAllocatorDefault``.
public final class CFAllocator: Sendable {
    private init() {}
}

/// The default allocator: `nil`, as every SecItem call may take.
public let kCFAllocatorDefault: CFAllocator? = nil

/// `kCFBooleanTrue`, an implicitly unwrapped optional as Apple's overlay imports it.
public let kCFBooleanTrue: CFBoolean! = true

/// `kCFBooleanFalse`.
public let kCFBooleanFalse: CFBoolean! = false
#endif
