#if !canImport(Darwin)
import Foundation
import VaultCrypto
// Apple's status codes (SecBase.h), with the values and messages Security.framework uses.

/// `0`: No error.
public let errSecSuccess: OSStatus = 0
/// `-4`: Function or operation not implemented.
public let errSecUnimplemented: OSStatus = -4
/// `-34`: The disk is full.
public let errSecDiskFull: OSStatus = -34
/// `-36`: I/O error.
public let errSecIO: OSStatus = -36
/// `-49`: File already open with write permission.
public let errSecOpWr: OSStatus = -49
/// `-50`: One or more parameters passed to a function were not valid.
public let errSecParam: OSStatus = -50
/// `-61`: Write permissions error.
public let errSecWrPerm: OSStatus = -61
/// `-108`: Failed to allocate memory.
public let errSecAllocate: OSStatus = -108
/// `-128`: User canceled the operation.
public let errSecUserCanceled: OSStatus = -128
/// `-909`: Bad parameter or invalid state for operation.
public let errSecBadReq: OSStatus = -909
/// `-2070`: Internal error.
public let errSecInternalComponent: OSStatus = -2070
/// `-4960`: Internal error.
public let errSecCoreFoundationUnknown: OSStatus = -4960
/// `-34018`: A required entitlement isn't present.
public let errSecMissingEntitlement: OSStatus = -34018
/// `-34020`: Client is restricted and is not permitted to perform this operation.
public let errSecRestrictedAPI: OSStatus = -34020
/// `-25291`: No keychain is available. You may need to restart your computer.
public let errSecNotAvailable: OSStatus = -25291
/// `-25292`: This keychain cannot be modified.
public let errSecReadOnly: OSStatus = -25292
/// `-25293`: The user name or passphrase you entered is not correct.
public let errSecAuthFailed: OSStatus = -25293
/// `-25294`: The specified keychain could not be found.
public let errSecNoSuchKeychain: OSStatus = -25294
/// `-25295`: The specified keychain is not a valid keychain file.
public let errSecInvalidKeychain: OSStatus = -25295
/// `-25296`: A keychain with the same name already exists.
public let errSecDuplicateKeychain: OSStatus = -25296
/// `-25297`: The specified callback function is already installed.
public let errSecDuplicateCallback: OSStatus = -25297
/// `-25298`: The specified callback function is not valid.
public let errSecInvalidCallback: OSStatus = -25298
/// `-25299`: The specified item already exists in the keychain.
public let errSecDuplicateItem: OSStatus = -25299
/// `-25300`: The specified item could not be found in the keychain.
public let errSecItemNotFound: OSStatus = -25300
/// `-25301`: There is not enough memory available to use the specified item.
public let errSecBufferTooSmall: OSStatus = -25301
/// `-25302`: This item contains information which is too large or in a format that cannot be displayed.
public let errSecDataTooLarge: OSStatus = -25302
/// `-25303`: The specified attribute does not exist.
public let errSecNoSuchAttr: OSStatus = -25303
/// `-25304`: The specified item is no longer valid. It may have been deleted from the keychain.
public let errSecInvalidItemRef: OSStatus = -25304
/// `-25305`: Unable to search the current keychain.
public let errSecInvalidSearchRef: OSStatus = -25305
/// `-25306`: The specified item does not appear to be a valid keychain item.
public let errSecNoSuchClass: OSStatus = -25306
/// `-25307`: A default keychain could not be found.
public let errSecNoDefaultKeychain: OSStatus = -25307
/// `-25308`: User interaction is not allowed.
public let errSecInteractionNotAllowed: OSStatus = -25308
/// `-25309`: The specified attribute could not be modified.
public let errSecReadOnlyAttr: OSStatus = -25309
/// `-25310`: This keychain was created by a different version of the system software and cannot be opened.
public let errSecWrongSecVersion: OSStatus = -25310
/// `-25311`: This item specifies a key size which is too large or too small.
public let errSecKeySizeNotAllowed: OSStatus = -25311
/// `-25312`: A required component (data storage module) could not be loaded. You may need to restart your computer.
public let errSecNoStorageModule: OSStatus = -25312
/// `-25313`: A required component (certificate module) could not be loaded. You may need to restart your computer.
public let errSecNoCertificateModule: OSStatus = -25313
/// `-25314`: A required component (policy module) could not be loaded. You may need to restart your computer.
public let errSecNoPolicyModule: OSStatus = -25314
/// `-25315`: User interaction is required, but is currently not allowed.
public let errSecInteractionRequired: OSStatus = -25315
/// `-25316`: The contents of this item cannot be retrieved.
public let errSecDataNotAvailable: OSStatus = -25316
/// `-25317`: The contents of this item cannot be modified.
public let errSecDataNotModifiable: OSStatus = -25317
/// `-25318`: One or more certificates required to validate this certificate cannot be found.
public let errSecCreateChainFailed: OSStatus = -25318
/// `-25319`: The specified preferences domain is not valid.
public let errSecInvalidPrefsDomain: OSStatus = -25319
/// `-25320`: In dark wake, no UI possible
public let errSecInDarkWake: OSStatus = -25320
/// `-26275`: Unable to decode the provided data.
public let errSecDecode: OSStatus = -26275

private let errorMessages: [OSStatus: String] = [
    errSecSuccess: "No error.",
    errSecUnimplemented: "Function or operation not implemented.",
    errSecDiskFull: "The disk is full.",
    errSecIO: "I/O error.",
    errSecOpWr: "File already open with write permission.",
    errSecParam: "One or more parameters passed to a function were not valid.",
    errSecWrPerm: "Write permissions error.",
    errSecAllocate: "Failed to allocate memory.",
    errSecUserCanceled: "User canceled the operation.",
    errSecBadReq: "Bad parameter or invalid state for operation.",
    errSecMissingEntitlement: "A required entitlement isn't present.",
    errSecRestrictedAPI: "Client is restricted and is not permitted to perform this operation.",
    errSecNotAvailable: "No keychain is available. You may need to restart your computer.",
    errSecReadOnly: "This keychain cannot be modified.",
    errSecAuthFailed: "The user name or passphrase you entered is not correct.",
    errSecNoSuchKeychain: "The specified keychain could not be found.",
    errSecInvalidKeychain: "The specified keychain is not a valid keychain file.",
    errSecDuplicateKeychain: "A keychain with the same name already exists.",
    errSecDuplicateCallback: "The specified callback function is already installed.",
    errSecInvalidCallback: "The specified callback function is not valid.",
    errSecDuplicateItem: "The specified item already exists in the keychain.",
    errSecItemNotFound: "The specified item could not be found in the keychain.",
    errSecBufferTooSmall: "There is not enough memory available to use the specified item.",
    errSecDataTooLarge: "This item contains information which is too large or in a format that cannot be displayed.",
    errSecNoSuchAttr: "The specified attribute does not exist.",
    errSecInvalidItemRef: "The specified item is no longer valid. It may have been deleted from the keychain.",
    errSecInvalidSearchRef: "Unable to search the current keychain.",
    errSecNoSuchClass: "The specified item does not appear to be a valid keychain item.",
    errSecNoDefaultKeychain: "A default keychain could not be found.",
    errSecInteractionNotAllowed: "User interaction is not allowed.",
    errSecReadOnlyAttr: "The specified attribute could not be modified.",
    errSecWrongSecVersion: "This keychain was created by a different version of the system software and cannot be opened.",
    errSecKeySizeNotAllowed: "This item specifies a key size which is too large or too small.",
    errSecNoStorageModule: "A required component (data storage module) could not be loaded. You may need to restart your computer.",
    errSecNoCertificateModule: "A required component (certificate module) could not be loaded. You may need to restart your computer.",
    errSecNoPolicyModule: "A required component (policy module) could not be loaded. You may need to restart your computer.",
    errSecInteractionRequired: "User interaction is required, but is currently not allowed.",
    errSecDataNotAvailable: "The contents of this item cannot be retrieved.",
    errSecDataNotModifiable: "The contents of this item cannot be modified.",
    errSecCreateChainFailed: "One or more certificates required to validate this certificate cannot be found.",
    errSecInvalidPrefsDomain: "The specified preferences domain is not valid.",
    errSecInDarkWake: "In dark wake, no UI possible",
    errSecDecode: "Unable to decode the provided data.",
]

/// A human-readable description of `status`, as Apple's function gives it.
///
/// ```swift
/// let text = SecCopyErrorMessageString(errSecItemNotFound, nil) as String?
/// ```
/// - Parameters:
///   - status: An `errSec*` code.
///   - reserved: Pass `nil`.
/// - Returns: The message, or `OSStatus <n>` for a code this table does not know.
public func SecCopyErrorMessageString(_ status: OSStatus, _ reserved: UnsafeMutableRawPointer?) -> CFString? {
    (errorMessages[status] ?? "OSStatus \(status)") as NSString
}

// MARK: - Random bytes

/// A source of random bytes for ``SecRandomCopyBytes(_:_:_:)``.
public final class SecRandom: Sendable {
    private init() {}
}

/// The system's cryptographically secure generator (`getrandom(2)` through libsodium).
public let kSecRandomDefault: SecRandom? = nil

/// Fills `bytes` with `count` cryptographically secure random bytes.
///
/// ```swift
/// var key = [UInt8](repeating: 0, count: 32)
/// let status = SecRandomCopyBytes(kSecRandomDefault, key.count, &key)
/// ```
/// - Returns: `errSecSuccess`; `errSecParam` for a null buffer with a non-zero count.
@discardableResult
public func SecRandomCopyBytes(_ rnd: SecRandom?, _ count: Int, _ bytes: UnsafeMutableRawPointer) -> Int32 {
    guard count >= 0 else { return errSecParam }
    guard count > 0 else { return errSecSuccess }
    var random = Crypto.randomBytes(count)
    random.withUnsafeBytes { bytes.copyMemory(from: $0.baseAddress!, byteCount: count) }
    for index in random.indices { random[index] = 0 }
    return errSecSuccess
}
#endif
