import LockboxCore

/// One credential in git's helper protocol (gitcredentials(7)): `key=value` lines ended by
/// a blank line or the end of input.
///
/// Secrets (`password`, `oauth_refresh_token`) are held in ``SecretBytes``; everything else
/// is plain text.
public struct GitCredential: Sendable {
    public var `protocol`: String?
    /// The host, with `:port` when git gives one.
    public var host: String?
    public var path: String?
    public var username: String?
    public var password: SecretBytes?
    /// Unix time after which the password is no longer valid.
    public var passwordExpiryUTC: Int64?
    public var oauthRefreshToken: SecretBytes?

    public init() {}

    /// The largest input accepted, in bytes: 1 MiB. git and its helpers set no limit on a line
    /// (`wwwauth[]` carries whole `WWW-Authenticate` headers), so lines may be of any length up
    /// to this bound on the whole credential.
    public static let maximumInputSize = 1 << 20

    /// Why input was refused. Messages never quote the input: it may hold a secret.
    public struct ParseError: Error, Sendable, Hashable, CustomStringConvertible {
        public let description: String
    }

    /// The keys whose values Lockbox stores or answers with.
    static let knownKeys: Set<String> = [
        "protocol", "host", "path", "username", "password", "oauth_refresh_token", "password_expiry_utc", "url",
    ]

    /// Parses a credential from helper input. Pure: no I/O, any bytes in.
    ///
    /// A control character (below 0x20, or DEL) in any key or value is refused, in `url=`
    /// after percent-decoding: it could smuggle a line into what the helper stores or answers
    /// (`url=https://host/%0Aoauth_refresh_token=...`). The one exception is a tab in the
    /// value of a key Lockbox ignores (`wwwauth[]` carries HTTP header text, where tabs are
    /// legal). A line may end in CRLF; a CR anywhere else is refused.
    /// - Throws: ``ParseError`` for input over ``maximumInputSize`` bytes, a line without
    ///   `=`, a control character, or text that is not UTF-8.
    public static func parse(_ input: [UInt8]) throws(ParseError) -> GitCredential {
        guard input.count <= maximumInputSize else {
            throw ParseError(
                description: "the credential is \(input.count) bytes; at most \(maximumInputSize) (1 MiB) are accepted")
        }
        var credential = GitCredential()
        var lineStart = 0
        while lineStart < input.count {
            var lineEnd = lineStart
            while lineEnd < input.count && input[lineEnd] != UInt8(ascii: "\n") { lineEnd += 1 }
            var contentEnd = lineEnd
            if contentEnd > lineStart && input[contentEnd - 1] == UInt8(ascii: "\r") { contentEnd -= 1 }
            defer { lineStart = lineEnd + 1 }
            if contentEnd == lineStart { break }  // a blank line ends the credential
            let line = input[lineStart..<contentEnd]
            guard let equals = line.firstIndex(of: UInt8(ascii: "=")) else {
                throw ParseError(description: "a credential line has no '='")
            }
            let keyBytes = line[lineStart..<equals]
            guard !keyBytes.contains(where: isControl), let key = String(validating: keyBytes, as: UTF8.self) else {
                throw ParseError(description: "a credential key contains a control character or is not UTF-8")
            }
            let valueBytes = line[(equals + 1)...]
            let allowed: (UInt8) -> Bool = knownKeys.contains(key) ? { _ in false } : { $0 == 0x09 }
            if valueBytes.contains(where: { isControl($0) && !allowed($0) }) {
                throw ParseError(description: controlCharacterMessage(key))
            }
            try credential.set(key, valueBytes)
        }
        return credential
    }

    /// C0 controls (NUL, CR, LF, ...) and DEL.
    static func isControl(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == 0x7F
    }

    static func controlCharacterMessage(_ key: String) -> String {
        "the value of \(key) contains a control character (CR, LF, NUL, another byte below 0x20, or DEL), "
            + "which git's credential protocol cannot carry safely; the credential was refused"
    }

    private mutating func set(_ key: String, _ value: ArraySlice<UInt8>) throws(ParseError) {
        func text() throws(ParseError) -> String {
            guard let string = String(validating: value, as: UTF8.self) else {
                throw ParseError(description: "the value of \(key) is not UTF-8")
            }
            return string
        }
        switch key {
        case "protocol": `protocol` = try text()
        case "host": host = try text()
        case "path": path = try text()
        case "username": username = try text()
        case "password": password = SecretBytes(copying: value)
        case "oauth_refresh_token": oauthRefreshToken = SecretBytes(copying: value)
        case "password_expiry_utc": passwordExpiryUTC = Int64(try text())
        case "url": try apply(url: value)
        default: break  // unknown keys, and `key[]` lists (capability[], wwwauth[]), are ignored
        }
    }

    /// `url=scheme://user:password@host:port/path` fills the parts it has, as git does:
    /// user, password, host and path are percent-decoded, and each is then held to the same
    /// rule as a plain value (no control character).
    private mutating func apply(url bytes: ArraySlice<UInt8>) throws(ParseError) {
        guard let url = String(validating: bytes, as: UTF8.self) else {
            throw ParseError(description: "the url is not UTF-8")
        }
        guard let schemeEnd = url.firstRange(of: "://"), schemeEnd.lowerBound > url.startIndex else {
            throw ParseError(description: "the url has no scheme")
        }
        func decoded(_ part: Substring, _ name: String) throws(ParseError) -> [UInt8] {
            let bytes = Array(part.utf8).removingPercentEncoding
            guard !bytes.contains(where: Self.isControl) else {
                throw ParseError(description: Self.controlCharacterMessage("url (its \(name), percent-decoded)"))
            }
            return bytes
        }
        func decodedText(_ part: Substring, _ name: String) throws(ParseError) -> String {
            guard let text = String(validating: try decoded(part, name), as: UTF8.self) else {
                throw ParseError(description: "the url's \(name) is not UTF-8 once percent-decoded")
            }
            return text
        }
        `protocol` = String(url[..<schemeEnd.lowerBound])
        var rest = url[schemeEnd.upperBound...]
        var authority = rest
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            rest = rest[rest.index(after: slash)...]
            path = rest.isEmpty ? nil : try decodedText(rest, "path")
        } else {
            path = nil
        }
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            authority = authority[authority.index(after: at)...]
            if let colon = userInfo.firstIndex(of: ":") {
                username = try decodedText(userInfo[..<colon], "username")
                var secret = try decoded(userInfo[userInfo.index(after: colon)...], "password")
                password = SecretBytes(copying: secret)
                secret.wipe()
            } else {
                username = try decodedText(userInfo, "username")
            }
        }
        host = authority.isEmpty ? nil : try decodedText(authority, "host")
    }

    /// The name of the first field that holds a control character, which the protocol cannot
    /// carry (a stored value another program wrote may); nil when every field is clean.
    public var fieldWithControlCharacter: String? {
        func dirty(_ bytes: some Sequence<UInt8>) -> Bool { bytes.contains(where: Self.isControl) }
        if let username, dirty(username.utf8) { return "username" }
        if let password, password.withUnsafeBytes({ dirty($0) }) { return "password" }
        if let oauthRefreshToken, oauthRefreshToken.withUnsafeBytes({ dirty($0) }) { return "oauth_refresh_token" }
        return nil
    }

    /// The reply to `get`: `username`, `password` and the optional fields, one per line.
    /// Values that contain a control character are left out (the protocol cannot carry a
    /// newline, and readers, ``parse(_:)`` and git among them, strip a CR before the LF);
    /// ``fieldWithControlCharacter`` tells beforehand.
    public func serialized() -> [UInt8] {
        var output: [UInt8] = []
        func line(_ key: String, _ value: [UInt8]) {
            guard !value.contains(where: Self.isControl) else { return }
            output.append(contentsOf: Array(key.utf8))
            output.append(UInt8(ascii: "="))
            output.append(contentsOf: value)
            output.append(UInt8(ascii: "\n"))
        }
        if let username { line("username", Array(username.utf8)) }
        if let password {
            var bytes = password.withUnsafeBytes { Array($0) }
            line("password", bytes)
            bytes.wipe()
        }
        if let passwordExpiryUTC { line("password_expiry_utc", Array(String(passwordExpiryUTC).utf8)) }
        if let oauthRefreshToken {
            var bytes = oauthRefreshToken.withUnsafeBytes { Array($0) }
            line("oauth_refresh_token", bytes)
            bytes.wipe()
        }
        return output
    }

    /// The host without `:port`, and the port.
    var hostAndPort: (host: String, port: Int?)? {
        guard let host, !host.isEmpty else { return nil }
        // IPv6 literals are bracketed: "[::1]:8080".
        if let colon = host.lastIndex(of: ":"), !host[colon...].contains("]" as Character),
            let port = Int(host[host.index(after: colon)...]), port > 0, port < 65536
        {
            return (String(host[..<colon]), port)
        }
        return (host, nil)
    }
}

extension Array where Element == UInt8 {
    /// `%XX` replaced by its byte, as git's url_decode does; a `%` not followed by two hex
    /// digits stays as it is.
    var removingPercentEncoding: [UInt8] {
        func hexValue(_ byte: UInt8) -> UInt8? {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var result: [UInt8] = []
        result.reserveCapacity(count)
        var index = 0
        while index < count {
            if self[index] == UInt8(ascii: "%"), index + 2 < count,
                let high = hexValue(self[index + 1]), let low = hexValue(self[index + 2])
            {
                result.append(high << 4 | low)
                index += 3
            } else {
                result.append(self[index])
                index += 1
            }
        }
        return result
    }
}
