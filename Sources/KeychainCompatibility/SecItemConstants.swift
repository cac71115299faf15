#if !canImport(Darwin)
// The kSec* keys and values, with the string values Security.framework uses, so that code
// printing or comparing them sees the same text as on Apple platforms.

// MARK: Item class key and values (`kSecClass`)

/// The key whose value is the item's class. Required in every call.
nonisolated(unsafe) public let kSecClass: CFString = "class"
/// A generic password: primary key service + account.
nonisolated(unsafe) public let kSecClassGenericPassword: CFString = "genp"
/// An internet password: primary key server, protocol, port, path, account, authentication type, security domain.
nonisolated(unsafe) public let kSecClassInternetPassword: CFString = "inet"
/// A certificate (stored as data; Linux has no `SecCertificate`).
nonisolated(unsafe) public let kSecClassCertificate: CFString = "cert"
/// A cryptographic key: a ``SecKey`` (``kSecValueRef``, ``kSecReturnRef``).
nonisolated(unsafe) public let kSecClassKey: CFString = "keys"
/// An identity. Not supported: a query with it fails with `errSecUnimplemented`.
nonisolated(unsafe) public let kSecClassIdentity: CFString = "idnt"

// MARK: Attribute keys

/// When the item can be read: one of the `kSecAttrAccessible*` values.
nonisolated(unsafe) public let kSecAttrAccessible: CFString = "pdmn"
/// A ``SecAccessControl`` made by ``SecAccessControlCreateWithFlags(_:_:_:_:)``.
nonisolated(unsafe) public let kSecAttrAccessControl: CFString = "accc"
/// The access group the item belongs to.
nonisolated(unsafe) public let kSecAttrAccessGroup: CFString = "agrp"
/// Whether the item is synchronizable; in a query, also ``kSecAttrSynchronizableAny``.
nonisolated(unsafe) public let kSecAttrSynchronizable: CFString = "sync"
/// The creation date, set by the store.
nonisolated(unsafe) public let kSecAttrCreationDate: CFString = "cdat"
/// The last modification date, set by the store.
nonisolated(unsafe) public let kSecAttrModificationDate: CFString = "mdat"
/// A user-visible description of the kind of item.
nonisolated(unsafe) public let kSecAttrDescription: CFString = "desc"
/// A user-editable comment.
nonisolated(unsafe) public let kSecAttrComment: CFString = "icmt"
/// The item's creator code. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCreator: CFString = "crtr"
/// The item's type code (passwords). Not stored by Lockbox. Same key as ``kSecAttrKeyType``.
nonisolated(unsafe) public let kSecAttrType: CFString = "type"
/// The user-visible label.
nonisolated(unsafe) public let kSecAttrLabel: CFString = "labl"
/// Whether the item is hidden from users. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrIsInvisible: CFString = "invi"
/// Whether the item is a placeholder without a password. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrIsNegative: CFString = "nega"
/// The account name.
nonisolated(unsafe) public let kSecAttrAccount: CFString = "acct"
/// The service (generic passwords).
nonisolated(unsafe) public let kSecAttrService: CFString = "svce"
/// Application-defined bytes (generic passwords).
nonisolated(unsafe) public let kSecAttrGeneric: CFString = "gena"
/// The security domain (internet passwords).
nonisolated(unsafe) public let kSecAttrSecurityDomain: CFString = "sdmn"
/// The server's domain name or IP address (internet passwords).
nonisolated(unsafe) public let kSecAttrServer: CFString = "srvr"
/// The protocol: one of the `kSecAttrProtocol*` values.
nonisolated(unsafe) public let kSecAttrProtocol: CFString = "ptcl"
/// The authentication scheme: one of the `kSecAttrAuthenticationType*` values.
nonisolated(unsafe) public let kSecAttrAuthenticationType: CFString = "atyp"
/// The port number (internet passwords).
nonisolated(unsafe) public let kSecAttrPort: CFString = "port"
/// The path, usually of a URL (internet passwords).
nonisolated(unsafe) public let kSecAttrPath: CFString = "path"
/// The certificate's subject (DER).
nonisolated(unsafe) public let kSecAttrSubject: CFString = "subj"
/// The certificate's issuer (DER).
nonisolated(unsafe) public let kSecAttrIssuer: CFString = "issr"
/// The certificate's serial number (DER).
nonisolated(unsafe) public let kSecAttrSerialNumber: CFString = "slnr"
/// The certificate's subject key identifier. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrSubjectKeyID: CFString = "skid"
/// The hash of the certificate's public key. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrPublicKeyHash: CFString = "pkhh"
/// The certificate type (a number).
nonisolated(unsafe) public let kSecAttrCertificateType: CFString = "ctyp"
/// The certificate encoding. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCertificateEncoding: CFString = "cenc"
/// The key class: one of the `kSecAttrKeyClass*` values.
nonisolated(unsafe) public let kSecAttrKeyClass: CFString = "kcls"
/// The key's application label (usually a public-key hash).
nonisolated(unsafe) public let kSecAttrApplicationLabel: CFString = "klbl"
/// The key's private tag.
nonisolated(unsafe) public let kSecAttrApplicationTag: CFString = "atag"
/// The key algorithm: one of the `kSecAttrKeyType*` values.
nonisolated(unsafe) public let kSecAttrKeyType: CFString = "type"
/// The key size in bits.
nonisolated(unsafe) public let kSecAttrKeySizeInBits: CFString = "bsiz"
/// The effective key size in bits.
nonisolated(unsafe) public let kSecAttrEffectiveKeySize: CFString = "esiz"
/// Whether a generated key is stored. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrIsPermanent: CFString = "perm"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanEncrypt: CFString = "encr"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanDecrypt: CFString = "decr"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanDerive: CFString = "drve"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanSign: CFString = "sign"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanVerify: CFString = "vrfy"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanWrap: CFString = "wrap"
/// Key usage. Not stored by Lockbox.
nonisolated(unsafe) public let kSecAttrCanUnwrap: CFString = "unwp"
/// A token identifier: ``kSecAttrTokenIDSecureEnclave`` asks for a hardware-bound key (see
/// ``SecKeyCreateRandomKey(_:_:)``).
nonisolated(unsafe) public let kSecAttrTokenID: CFString = "tkid"
/// The Secure Enclave's token: on Linux, the machine's key hardware when Lockbox has it.
nonisolated(unsafe) public let kSecAttrTokenIDSecureEnclave: CFString = "com.apple.setoken"
/// Whether a key's private bytes may be exported (``SecKeyCopyExternalRepresentation(_:_:)``).
nonisolated(unsafe) public let kSecAttrIsExtractable: CFString = "extr"
/// Whether a key's bytes are sensitive (macOS). Accepted, not stored.
nonisolated(unsafe) public let kSecAttrIsSensitive: CFString = "sens"
/// `SecKeyCreateRandomKey`: attributes of the private key.
nonisolated(unsafe) public let kSecPrivateKeyAttrs: CFString = "private"
/// `SecKeyCreateRandomKey`: attributes of the public key.
nonisolated(unsafe) public let kSecPublicKeyAttrs: CFString = "public"

// MARK: Accessibility values (`kSecAttrAccessible`)

/// Readable while the vault is unlocked. The default.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlocked: CFString = "ak"
/// Readable from the first unlock after boot until reboot.
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlock: CFString = "ck"
/// Always readable. Deprecated by Apple.
nonisolated(unsafe) public let kSecAttrAccessibleAlways: CFString = "dk"
/// Only while a passphrase is set; never leaves this machine.
nonisolated(unsafe) public let kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly: CFString = "akpu"
/// As `WhenUnlocked`; never leaves this machine.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlockedThisDeviceOnly: CFString = "aku"
/// As `AfterFirstUnlock`; never leaves this machine.
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: CFString = "cku"
/// As `Always`; never leaves this machine. Deprecated by Apple.
nonisolated(unsafe) public let kSecAttrAccessibleAlwaysThisDeviceOnly: CFString = "dku"

// MARK: Synchronizable query value

/// In a query, matches synchronizable and non-synchronizable items.
nonisolated(unsafe) public let kSecAttrSynchronizableAny: CFString = "syna"

// MARK: Protocol values (`kSecAttrProtocol`)

nonisolated(unsafe) public let kSecAttrProtocolFTP: CFString = "ftp "
nonisolated(unsafe) public let kSecAttrProtocolFTPAccount: CFString = "ftpa"
nonisolated(unsafe) public let kSecAttrProtocolHTTP: CFString = "http"
nonisolated(unsafe) public let kSecAttrProtocolIRC: CFString = "irc "
nonisolated(unsafe) public let kSecAttrProtocolNNTP: CFString = "nntp"
nonisolated(unsafe) public let kSecAttrProtocolPOP3: CFString = "pop3"
nonisolated(unsafe) public let kSecAttrProtocolSMTP: CFString = "smtp"
nonisolated(unsafe) public let kSecAttrProtocolSOCKS: CFString = "sox "
nonisolated(unsafe) public let kSecAttrProtocolIMAP: CFString = "imap"
nonisolated(unsafe) public let kSecAttrProtocolLDAP: CFString = "ldap"
nonisolated(unsafe) public let kSecAttrProtocolAppleTalk: CFString = "atlk"
nonisolated(unsafe) public let kSecAttrProtocolAFP: CFString = "afp "
nonisolated(unsafe) public let kSecAttrProtocolTelnet: CFString = "teln"
nonisolated(unsafe) public let kSecAttrProtocolSSH: CFString = "ssh "
nonisolated(unsafe) public let kSecAttrProtocolFTPS: CFString = "ftps"
nonisolated(unsafe) public let kSecAttrProtocolHTTPS: CFString = "htps"
nonisolated(unsafe) public let kSecAttrProtocolHTTPProxy: CFString = "htpx"
nonisolated(unsafe) public let kSecAttrProtocolHTTPSProxy: CFString = "htsx"
nonisolated(unsafe) public let kSecAttrProtocolFTPProxy: CFString = "ftpx"
nonisolated(unsafe) public let kSecAttrProtocolSMB: CFString = "smb "
nonisolated(unsafe) public let kSecAttrProtocolRTSP: CFString = "rtsp"
nonisolated(unsafe) public let kSecAttrProtocolRTSPProxy: CFString = "rtsx"
nonisolated(unsafe) public let kSecAttrProtocolDAAP: CFString = "daap"
nonisolated(unsafe) public let kSecAttrProtocolEPPC: CFString = "eppc"
nonisolated(unsafe) public let kSecAttrProtocolIPP: CFString = "ipp "
nonisolated(unsafe) public let kSecAttrProtocolNNTPS: CFString = "ntps"
nonisolated(unsafe) public let kSecAttrProtocolLDAPS: CFString = "ldps"
nonisolated(unsafe) public let kSecAttrProtocolTelnetS: CFString = "tels"
nonisolated(unsafe) public let kSecAttrProtocolIMAPS: CFString = "imps"
nonisolated(unsafe) public let kSecAttrProtocolIRCS: CFString = "ircs"
nonisolated(unsafe) public let kSecAttrProtocolPOP3S: CFString = "pops"

// MARK: Authentication type values (`kSecAttrAuthenticationType`)

nonisolated(unsafe) public let kSecAttrAuthenticationTypeNTLM: CFString = "ntlm"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeMSN: CFString = "msna"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeDPA: CFString = "dpaa"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeRPA: CFString = "rpaa"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTTPBasic: CFString = "http"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTTPDigest: CFString = "httd"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTMLForm: CFString = "form"
nonisolated(unsafe) public let kSecAttrAuthenticationTypeDefault: CFString = "dflt"

// MARK: Key class values (`kSecAttrKeyClass`)

nonisolated(unsafe) public let kSecAttrKeyClassPublic: CFString = "0"
nonisolated(unsafe) public let kSecAttrKeyClassPrivate: CFString = "1"
nonisolated(unsafe) public let kSecAttrKeyClassSymmetric: CFString = "2"

// MARK: Key type values (`kSecAttrKeyType`)

nonisolated(unsafe) public let kSecAttrKeyTypeRSA: CFString = "42"
nonisolated(unsafe) public let kSecAttrKeyTypeEC: CFString = "73"
nonisolated(unsafe) public let kSecAttrKeyTypeECSECPrimeRandom: CFString = "73"
nonisolated(unsafe) public let kSecAttrKeyTypeAES: CFString = "2147483649"
/// Ed25519 keys (CryptoKit's `Curve25519.Signing`; Apple has no SecKey type for them).
nonisolated(unsafe) public let kSecAttrKeyTypeEd25519: CFString = "ed25519"
/// X25519 keys (CryptoKit's `Curve25519.KeyAgreement`).
nonisolated(unsafe) public let kSecAttrKeyTypeX25519: CFString = "x25519"

// MARK: Search keys and values

/// How many items to return: ``kSecMatchLimitOne`` (the default), ``kSecMatchLimitAll`` or a number.
nonisolated(unsafe) public let kSecMatchLimit: CFString = "m_Limit"
/// Return at most one item.
nonisolated(unsafe) public let kSecMatchLimitOne: CFString = "m_LimitOne"
/// Return every match.
nonisolated(unsafe) public let kSecMatchLimitAll: CFString = "m_LimitAll"
/// Case-insensitive string matching. Not supported: fails with `errSecUnimplemented` when true.
nonisolated(unsafe) public let kSecMatchCaseInsensitive: CFString = "m_CaseInsensitive"
/// Certificate policy matching. Not supported.
nonisolated(unsafe) public let kSecMatchPolicy: CFString = "m_Policy"
/// Restrict the search to given items. Not supported.
nonisolated(unsafe) public let kSecMatchItemList: CFString = "m_ItemList"
/// macOS keychain search list. Not supported.
nonisolated(unsafe) public let kSecMatchSearchList: CFString = "m_SearchList"
/// Certificate issuer matching. Not supported.
nonisolated(unsafe) public let kSecMatchIssuers: CFString = "m_Issuers"
/// Certificate e-mail matching. Not supported.
nonisolated(unsafe) public let kSecMatchEmailAddressIfPresent: CFString = "m_EmailAddressIfPresent"
/// Certificate subject matching. Not supported.
nonisolated(unsafe) public let kSecMatchSubjectContains: CFString = "m_SubjectContains"
/// Certificate trust matching. Not supported.
nonisolated(unsafe) public let kSecMatchTrustedOnly: CFString = "m_TrustedOnly"
/// Certificate validity matching. Not supported.
nonisolated(unsafe) public let kSecMatchValidOnDate: CFString = "m_ValidOnDate"

// MARK: Return result keys

/// Return the item's data (`Data`).
nonisolated(unsafe) public let kSecReturnData: CFString = "r_Data"
/// Return the item's attributes (`[String: Any]`).
nonisolated(unsafe) public let kSecReturnAttributes: CFString = "r_Attributes"
/// Return a reference: a ``SecKey`` for keys (Apple supports it only for keys, certificates and identities on iOS). Certificates have no `SecCertificate` on Linux: `errSecUnimplemented`; for passwords it adds nothing.
nonisolated(unsafe) public let kSecReturnRef: CFString = "r_Ref"
/// Return a persistent reference (`Data`) that finds the item again through ``kSecValuePersistentRef``.
nonisolated(unsafe) public let kSecReturnPersistentRef: CFString = "r_PersistentRef"

// MARK: Value keys

/// The item's secret data (`Data`); also the data's key in result dictionaries.
nonisolated(unsafe) public let kSecValueData: CFString = "v_Data"
/// An item reference: a ``SecKey`` to add or to find (keys only).
nonisolated(unsafe) public let kSecValueRef: CFString = "v_Ref"
/// A persistent reference: in a query, finds that one item; in result dictionaries, the item's reference.
nonisolated(unsafe) public let kSecValuePersistentRef: CFString = "v_PersistentRef"

// MARK: Other keys

/// An authentication context for items protected by access control (an `LAContext` on Apple platforms). Accepted and kept; see docs/SECITEM.md.
nonisolated(unsafe) public let kSecUseAuthenticationContext: CFString = "u_AuthCtx"
/// Whether the call may show authentication UI: ``kSecUseAuthenticationUIAllow``, ``kSecUseAuthenticationUIFail`` or ``kSecUseAuthenticationUISkip``.
nonisolated(unsafe) public let kSecUseAuthenticationUI: CFString = "u_AuthUI"
/// Authentication UI may be shown (the default).
nonisolated(unsafe) public let kSecUseAuthenticationUIAllow: CFString = "u_AuthUIA"
/// Fail with `errSecInteractionNotAllowed` instead of asking the user.
nonisolated(unsafe) public let kSecUseAuthenticationUIFail: CFString = "u_AuthUIF"
/// Skip items that would need the user to authenticate.
nonisolated(unsafe) public let kSecUseAuthenticationUISkip: CFString = "u_AuthUIS"
/// The text shown when the user must authenticate.
nonisolated(unsafe) public let kSecUseOperationPrompt: CFString = "u_OpPrompt"
/// Deprecated by Apple: use ``kSecUseAuthenticationUI``.
nonisolated(unsafe) public let kSecUseNoAuthenticationUI: CFString = "u_NoAuthUI"
/// macOS only: use the data-protection keychain. Accepted and ignored: Lockbox always behaves as the iOS data-protection keychain.
nonisolated(unsafe) public let kSecUseDataProtectionKeychain: CFString = "nleg"

#endif
