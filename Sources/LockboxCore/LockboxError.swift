/// The one error type Lockbox throws at its public edge.
///
/// `code` carries Apple's `OSStatus` value, so code that already knows the Keychain's
/// statuses keeps working, and `message` says what happened and what to do about it.
/// A message never contains a secret: errors are built from fixed text and non-secret
/// names (paths, attribute names, service names), never from item data.
///
/// ```swift
/// do {
///     let token = try store.data(matching: query)
/// } catch LockboxError.itemNotFound {
///     // sign in again
/// } catch LockboxError.interactionNotAllowed {
///     // locked: ask the user to unlock, do not sign out
/// }
/// ```
public struct LockboxError: Error, Sendable, Hashable, CustomStringConvertible {
    /// An error code: Apple's `OSStatus` value for the condition.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        /// Apple's `OSStatus` value.
        public let rawValue: Int32
        /// The code for an `OSStatus` value.
        public init(rawValue: Int32) { self.rawValue = rawValue }

        /// `errSecUserCanceled`: the user cancelled an authentication prompt.
        public static let userCanceled = Code(rawValue: -128)
        /// `errSecParam`: a malformed query or value (missing class, value too large, ...).
        public static let param = Code(rawValue: -50)
        /// `errSecIO`: reading or writing the store failed (disk full, I/O error, busy).
        public static let io = Code(rawValue: -36)
        /// `errSecUnimplemented`: the backend cannot do this.
        public static let unimplemented = Code(rawValue: -4)
        /// `errSecAuthFailed`: wrong passphrase or failed user verification.
        public static let authFailed = Code(rawValue: -25293)
        /// `errSecNoSuchKeychain`: there is no keychain at the given location.
        public static let noSuchKeychain = Code(rawValue: -25294)
        /// `errSecDuplicateKeychain`: a keychain already exists at the given location.
        public static let duplicateKeychain = Code(rawValue: -25296)
        /// `errSecNotAvailable`: no store or unlock method is available.
        public static let notAvailable = Code(rawValue: -25291)
        /// `errSecDuplicateItem`: an item with the same primary key exists.
        public static let duplicateItem = Code(rawValue: -25299)
        /// `errSecItemNotFound`: no item matched.
        public static let itemNotFound = Code(rawValue: -25300)
        /// `errSecInteractionNotAllowed`: the item exists (or may) but is locked now.
        public static let interactionNotAllowed = Code(rawValue: -25308)
        /// `errSecDecode`: stored data failed to authenticate or decode.
        public static let decode = Code(rawValue: -26275)
        /// `errSecMissingEntitlement`: the access group is not one this store may use.
        public static let missingEntitlement = Code(rawValue: -34018)
        /// `errSecAllocate`: not enough memory (for example for Argon2id under a container's
        /// memory limit).
        public static let allocate = Code(rawValue: -108)
        /// `errSecDataNotAvailable`: the item's value may not leave the keychain (a
        /// non-extractable private key: use it through the key API instead).
        public static let dataNotAvailable = Code(rawValue: -25316)
        /// `errSecKeyUsageIncorrect`: the key was not created for this operation (signing
        /// with a key made only for key agreement, and so on).
        public static let keyUsageIncorrect = Code(rawValue: -67731)
        /// `errSecInvalidKeyRef`: the key was invalidated (it was bound to the passphrase,
        /// which has since changed or been removed). Delete it and make a new one.
        public static let invalidKeyRef = Code(rawValue: -67712)

        /// `OSStatus N`.
        public var description: String { "OSStatus \(rawValue)" }

        /// Lets `catch LockboxError.itemNotFound` read naturally.
        public static func ~= (code: Code, error: any Error) -> Bool {
            (error as? LockboxError)?.code == code
        }

        /// Matches a `LockboxError` by its code: `catch LockboxError.itemNotFound`.
        public static func ~= (code: Code, error: LockboxError) -> Bool {
            error.code == code
        }
    }

    /// What the operating system or SQLite reported, when the error comes from one of them.
    ///
    /// Only numbers and the name of the failed call: never data, never a secret.
    public struct Cause: Sendable, Hashable, CustomStringConvertible {
        /// The system call or library function that failed (`add_key`, `sqlite3_step`, ...).
        public let operation: String
        /// SQLite's extended result code (`SQLITE_CONSTRAINT_UNIQUE` is 2067), when SQLite failed.
        public let sqliteExtendedCode: Int32?
        /// The C `errno` value, when a system call failed.
        public let errno: Int32?

        /// A failed SQLite call and its extended result code.
        public static func sqlite(_ operation: String, extendedCode: Int32) -> Cause {
            Cause(operation: operation, sqliteExtendedCode: extendedCode, errno: nil)
        }

        /// A failed system call and its `errno`.
        public static func systemCall(_ operation: String, errno: Int32) -> Cause {
            Cause(operation: operation, sqliteExtendedCode: nil, errno: errno)
        }

        /// The operation and its result code or `errno`.
        public var description: String {
            if let sqliteExtendedCode { return "\(operation): SQLite result \(sqliteExtendedCode)" }
            return "\(operation): errno \(errno ?? 0)"
        }
    }

    /// What went wrong, as Apple's `OSStatus`.
    public let code: Code
    /// The human-readable message. It never contains a secret.
    public let message: String
    /// The underlying failure, for callers and tests that match codes rather than text.
    public let cause: Cause?

    /// An error with `code`, a `message` that says what to do, and the underlying `cause`.
    public init(_ code: Code, _ message: String, cause: Cause? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    /// SQLite's extended result code, when SQLite reported this error.
    public var sqliteExtendedCode: Int32? { cause?.sqliteExtendedCode }

    /// The C `errno` value, when a system call reported this error.
    public var errno: Int32? { cause?.errno }

    /// Apple's `OSStatus` value.
    public var status: Int32 { code.rawValue }

    /// `message (OSStatus -25308)`: scripts can match the status in text form.
    public var description: String { "\(message) (OSStatus \(status))" }

    /// `errSecItemNotFound` (-25300), for `catch LockboxError.itemNotFound`.
    public static let itemNotFound = Code.itemNotFound
    /// `errSecDuplicateItem` (-25299).
    public static let duplicateItem = Code.duplicateItem
    /// `errSecInteractionNotAllowed` (-25308): locked, never "not found".
    public static let interactionNotAllowed = Code.interactionNotAllowed
    /// `errSecAuthFailed` (-25293).
    public static let authFailed = Code.authFailed
    /// `errSecUserCanceled` (-128).
    public static let userCanceled = Code.userCanceled
    /// `errSecParam` (-50).
    public static let param = Code.param
    /// `errSecDecode` (-26275): a failed open or a damaged or tampered record.
    public static let decode = Code.decode
    /// `errSecIO` (-36).
    public static let io = Code.io
    /// `errSecNotAvailable` (-25291).
    public static let notAvailable = Code.notAvailable
    /// `errSecMissingEntitlement` (-34018).
    public static let missingEntitlement = Code.missingEntitlement
    /// `errSecNoSuchKeychain` (-25294).
    public static let noSuchKeychain = Code.noSuchKeychain
    /// `errSecDuplicateKeychain` (-25296).
    public static let duplicateKeychain = Code.duplicateKeychain
    /// `errSecUnimplemented` (-4).
    public static let unimplemented = Code.unimplemented
    /// `errSecAllocate` (-108).
    public static let allocate = Code.allocate
    /// `errSecDataNotAvailable` (-25316).
    public static let dataNotAvailable = Code.dataNotAvailable
    /// `errSecKeyUsageIncorrect` (-67731).
    public static let keyUsageIncorrect = Code.keyUsageIncorrect
    /// `errSecInvalidKeyRef` (-67712).
    public static let invalidKeyRef = Code.invalidKeyRef
}

extension LockboxError {
    /// The opaque error for any stored blob that fails to open. It deliberately says nothing
    /// about which check failed, so it is no oracle.
    public static func integrity(_ what: String = "An item") -> LockboxError {
        LockboxError(
            .decode,
            "\(what) failed its integrity check: the keychain file was modified or is damaged. "
                + "Restore it from a backup.")
    }

    /// The store is locked: never to be confused with "not found".
    public static func locked(_ hint: String) -> LockboxError {
        LockboxError(.interactionNotAllowed, "The keychain is locked. \(hint)")
    }
}
