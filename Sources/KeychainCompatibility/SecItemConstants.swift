#if !canImport(Security)
// The kSec* keys and values, with the string values Security.framework uses, so that code
// printing or comparing them sees the same text as on Apple platforms.

// MARK: Item class key and values (`kSecClass`)

/// The key whose value is the item's class. Required in every call.
public let kSecClass: CFString = "class"
/// A generic password: primary key service + account.
public let kSecClassGenericPassword: CFString = "genp"
/// An internet password: primary key server, protocol, port, path, account, authentication type, security domain.
public let kSecClassInternetPassword: CFString = "inet"
/// A certificate (stored as data; Linux has no `SecCertificate`).
public let kSecClassCertificate: CFString = "cert"
/// A cryptographic key (stored as data; Linux has no `SecKey`).
public let kSecClassKey: CFString = "keys"
/// An identity. Not supported: a query with it fails with `errSecUnimplemented`.
public let kSecClassIdentity: CFString = "idnt"

// MARK: Attribute keys

/// When the item can be read: one of the `kSecAttrAccessible*` values.
public let kSecAttrAccessible: CFString = "pdmn"
/// A ``SecAccessControl`` made by ``SecAccessControlCreateWithFlags(_:_:_:_:)``.
public let kSecAttrAccessControl: CFString = "accc"
/// The access group the item belongs to.
public let kSecAttrAccessGroup: CFString = "agrp"
/// Whether the item is synchronizable; in a query, also ``kSecAttrSynchronizableAny``.
public let kSecAttrSynchronizable: CFString = "sync"
/// The creation date, set by the store.
public let kSecAttrCreationDate: CFString = "cdat"
/// The last modification date, set by the store.
public let kSecAttrModificationDate: CFString = "mdat"
/// A user-visible description of the kind of item.
public let kSecAttrDescription: CFString = "desc"
/// A user-editable comment.
public let kSecAttrComment: CFString = "icmt"
/// The item's creator code. Not stored by Lockbox.
public let kSecAttrCreator: CFString = "crtr"
/// The item's type code (passwords). Not stored by Lockbox. Same key as ``kSecAttrKeyType``.
public let kSecAttrType: CFString = "type"
/// The user-visible label.
public let kSecAttrLabel: CFString = "labl"
/// Whether the item is hidden from users. Not stored by Lockbox.
public let kSecAttrIsInvisible: CFString = "invi"
/// Whether the item is a placeholder without a password. Not stored by Lockbox.
public let kSecAttrIsNegative: CFString = "nega"
/// The account name.
public let kSecAttrAccount: CFString = "acct"
/// The service (generic passwords).
public let kSecAttrService: CFString = "svce"
/// Application-defined bytes (generic passwords).
public let kSecAttrGeneric: CFString = "gena"
/// The security domain (internet passwords).
public let kSecAttrSecurityDomain: CFString = "sdmn"
/// The server's domain name or IP address (internet passwords).
public let kSecAttrServer: CFString = "srvr"
/// The protocol: one of the `kSecAttrProtocol*` values.
public let kSecAttrProtocol: CFString = "ptcl"
/// The authentication scheme: one of the `kSecAttrAuthenticationType*` values.
public let kSecAttrAuthenticationType: CFString = "atyp"
/// The port number (internet passwords).
public let kSecAttrPort: CFString = "port"
/// The path, usually of a URL (internet passwords).
public let kSecAttrPath: CFString = "path"
/// The certificate's subject (DER).
public let kSecAttrSubject: CFString = "subj"
/// The certificate's issuer (DER).
public let kSecAttrIssuer: CFString = "issr"
/// The certificate's serial number (DER).
public let kSecAttrSerialNumber: CFString = "slnr"
/// The certificate's subject key identifier. Not stored by Lockbox.
public let kSecAttrSubjectKeyID: CFString = "skid"
/// The hash of the certificate's public key. Not stored by Lockbox.
public let kSecAttrPublicKeyHash: CFString = "pkhh"
/// The certificate type (a number).
public let kSecAttrCertificateType: CFString = "ctyp"
/// The certificate encoding. Not stored by Lockbox.
public let kSecAttrCertificateEncoding: CFString = "cenc"
/// The key class: one of the `kSecAttrKeyClass*` values.
public let kSecAttrKeyClass: CFString = "kcls"
/// The key's application label (usually a public-key hash).
public let kSecAttrApplicationLabel: CFString = "klbl"
/// The key's private tag.
public let kSecAttrApplicationTag: CFString = "atag"
/// The key algorithm: one of the `kSecAttrKeyType*` values.
public let kSecAttrKeyType: CFString = "type"
/// The key size in bits.
public let kSecAttrKeySizeInBits: CFString = "bsiz"
/// The effective key size in bits.
public let kSecAttrEffectiveKeySize: CFString = "esiz"
/// Whether a generated key is stored. Not stored by Lockbox.
public let kSecAttrIsPermanent: CFString = "perm"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanEncrypt: CFString = "encr"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanDecrypt: CFString = "decr"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanDerive: CFString = "drve"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanSign: CFString = "sign"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanVerify: CFString = "vrfy"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanWrap: CFString = "wrap"
/// Key usage. Not stored by Lockbox.
public let kSecAttrCanUnwrap: CFString = "unwp"
/// A token (Secure Enclave) identifier. Not supported on Linux.
public let kSecAttrTokenID: CFString = "tkid"

// MARK: Accessibility values (`kSecAttrAccessible`)

/// Readable while the vault is unlocked. The default.
public let kSecAttrAccessibleWhenUnlocked: CFString = "ak"
/// Readable from the first unlock after boot until reboot.
public let kSecAttrAccessibleAfterFirstUnlock: CFString = "ck"
/// Always readable. Deprecated by Apple.
public let kSecAttrAccessibleAlways: CFString = "dk"
/// Only while a passphrase is set; never leaves this machine.
public let kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly: CFString = "akpu"
/// As `WhenUnlocked`; never leaves this machine.
public let kSecAttrAccessibleWhenUnlockedThisDeviceOnly: CFString = "aku"
/// As `AfterFirstUnlock`; never leaves this machine.
public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: CFString = "cku"
/// As `Always`; never leaves this machine. Deprecated by Apple.
public let kSecAttrAccessibleAlwaysThisDeviceOnly: CFString = "dku"

// MARK: Synchronizable query value

/// In a query, matches synchronizable and non-synchronizable items.
public let kSecAttrSynchronizableAny: CFString = "syna"

// MARK: Protocol values (`kSecAttrProtocol`)

public let kSecAttrProtocolFTP: CFString = "ftp "
public let kSecAttrProtocolFTPAccount: CFString = "ftpa"
public let kSecAttrProtocolHTTP: CFString = "http"
public let kSecAttrProtocolIRC: CFString = "irc "
public let kSecAttrProtocolNNTP: CFString = "nntp"
public let kSecAttrProtocolPOP3: CFString = "pop3"
public let kSecAttrProtocolSMTP: CFString = "smtp"
public let kSecAttrProtocolSOCKS: CFString = "sox "
public let kSecAttrProtocolIMAP: CFString = "imap"
public let kSecAttrProtocolLDAP: CFString = "ldap"
public let kSecAttrProtocolAppleTalk: CFString = "atlk"
public let kSecAttrProtocolAFP: CFString = "afp "
public let kSecAttrProtocolTelnet: CFString = "teln"
public let kSecAttrProtocolSSH: CFString = "ssh "
public let kSecAttrProtocolFTPS: CFString = "ftps"
public let kSecAttrProtocolHTTPS: CFString = "htps"
public let kSecAttrProtocolHTTPProxy: CFString = "htpx"
public let kSecAttrProtocolHTTPSProxy: CFString = "htsx"
public let kSecAttrProtocolFTPProxy: CFString = "ftpx"
public let kSecAttrProtocolSMB: CFString = "smb "
public let kSecAttrProtocolRTSP: CFString = "rtsp"
public let kSecAttrProtocolRTSPProxy: CFString = "rtsx"
public let kSecAttrProtocolDAAP: CFString = "daap"
public let kSecAttrProtocolEPPC: CFString = "eppc"
public let kSecAttrProtocolIPP: CFString = "ipp "
public let kSecAttrProtocolNNTPS: CFString = "ntps"
public let kSecAttrProtocolLDAPS: CFString = "ldps"
public let kSecAttrProtocolTelnetS: CFString = "tels"
public let kSecAttrProtocolIMAPS: CFString = "imps"
public let kSecAttrProtocolIRCS: CFString = "ircs"
public let kSecAttrProtocolPOP3S: CFString = "pops"

// MARK: Authentication type values (`kSecAttrAuthenticationType`)

public let kSecAttrAuthenticationTypeNTLM: CFString = "ntlm"
public let kSecAttrAuthenticationTypeMSN: CFString = "msna"
public let kSecAttrAuthenticationTypeDPA: CFString = "dpaa"
public let kSecAttrAuthenticationTypeRPA: CFString = "rpaa"
public let kSecAttrAuthenticationTypeHTTPBasic: CFString = "http"
public let kSecAttrAuthenticationTypeHTTPDigest: CFString = "httd"
public let kSecAttrAuthenticationTypeHTMLForm: CFString = "form"
public let kSecAttrAuthenticationTypeDefault: CFString = "dflt"

// MARK: Key class values (`kSecAttrKeyClass`)

public let kSecAttrKeyClassPublic: CFString = "0"
public let kSecAttrKeyClassPrivate: CFString = "1"
public let kSecAttrKeyClassSymmetric: CFString = "2"

// MARK: Key type values (`kSecAttrKeyType`)

public let kSecAttrKeyTypeRSA: CFString = "42"
public let kSecAttrKeyTypeEC: CFString = "73"
public let kSecAttrKeyTypeECSECPrimeRandom: CFString = "73"
public let kSecAttrKeyTypeAES: CFString = "2147483649"

// MARK: Search keys and values

/// How many items to return: ``kSecMatchLimitOne`` (the default), ``kSecMatchLimitAll`` or a number.
public let kSecMatchLimit: CFString = "m_Limit"
/// Return at most one item.
public let kSecMatchLimitOne: CFString = "m_LimitOne"
/// Return every match.
public let kSecMatchLimitAll: CFString = "m_LimitAll"
/// Case-insensitive string matching. Not supported: fails with `errSecUnimplemented` when true.
public let kSecMatchCaseInsensitive: CFString = "m_CaseInsensitive"
/// Certificate policy matching. Not supported.
public let kSecMatchPolicy: CFString = "m_Policy"
/// Restrict the search to given items. Not supported.
public let kSecMatchItemList: CFString = "m_ItemList"
/// macOS keychain search list. Not supported.
public let kSecMatchSearchList: CFString = "m_SearchList"
/// Certificate issuer matching. Not supported.
public let kSecMatchIssuers: CFString = "m_Issuers"
/// Certificate e-mail matching. Not supported.
public let kSecMatchEmailAddressIfPresent: CFString = "m_EmailAddressIfPresent"
/// Certificate subject matching. Not supported.
public let kSecMatchSubjectContains: CFString = "m_SubjectContains"
/// Certificate trust matching. Not supported.
public let kSecMatchTrustedOnly: CFString = "m_TrustedOnly"
/// Certificate validity matching. Not supported.
public let kSecMatchValidOnDate: CFString = "m_ValidOnDate"

// MARK: Return result keys

/// Return the item's data (`Data`).
public let kSecReturnData: CFString = "r_Data"
/// Return the item's attributes (`[String: Any]`).
public let kSecReturnAttributes: CFString = "r_Attributes"
/// Return a reference. Apple supports it only for keys, certificates and identities on iOS; on Linux there are no `SecKey`/`SecCertificate` objects, so it fails with `errSecUnimplemented` for those classes and adds nothing for passwords.
public let kSecReturnRef: CFString = "r_Ref"
/// Return a persistent reference (`Data`) that finds the item again through ``kSecValuePersistentRef``.
public let kSecReturnPersistentRef: CFString = "r_PersistentRef"

// MARK: Value keys

/// The item's secret data (`Data`); also the data's key in result dictionaries.
public let kSecValueData: CFString = "v_Data"
/// An item reference. Not supported on Linux.
public let kSecValueRef: CFString = "v_Ref"
/// A persistent reference: in a query, finds that one item; in result dictionaries, the item's reference.
public let kSecValuePersistentRef: CFString = "v_PersistentRef"

// MARK: Other keys

/// An authentication context for items protected by access control (an `LAContext` on Apple platforms). Accepted and kept; see docs/SECITEM.md.
public let kSecUseAuthenticationContext: CFString = "u_AuthCtx"
/// Whether the call may show authentication UI: ``kSecUseAuthenticationUIAllow``, ``kSecUseAuthenticationUIFail`` or ``kSecUseAuthenticationUISkip``.
public let kSecUseAuthenticationUI: CFString = "u_AuthUI"
/// Authentication UI may be shown (the default).
public let kSecUseAuthenticationUIAllow: CFString = "u_AuthUIA"
/// Fail with `errSecInteractionNotAllowed` instead of asking the user.
public let kSecUseAuthenticationUIFail: CFString = "u_AuthUIF"
/// Skip items that would need the user to authenticate.
public let kSecUseAuthenticationUISkip: CFString = "u_AuthUIS"
/// The text shown when the user must authenticate.
public let kSecUseOperationPrompt: CFString = "u_OpPrompt"
/// Deprecated by Apple: use ``kSecUseAuthenticationUI``.
public let kSecUseNoAuthenticationUI: CFString = "u_NoAuthUI"
/// macOS only: use the data-protection keychain. Accepted and ignored: Lockbox always behaves as the iOS data-protection keychain.
public let kSecUseDataProtectionKeychain: CFString = "nleg"

#endif
