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

    /// The longest line accepted, as git's own helpers accept.
    public static let maximumLineLength = 65535

    /// Why input was refused. Messages never quote the input: it may hold a secret.
    public struct ParseError: Error, Sendable, Hashable, CustomStringConvertible {
        public let description: String
    }

    /// Parses a credential from helper input. Pure: no I/O, any bytes in.
    /// - Throws: ``ParseError`` for a line over ``maximumLineLength`` bytes, a line without
    ///   `=`, a NUL byte, or text that is not UTF-8.
    public static func parse(_ input: [UInt8]) throws(ParseError) -> GitCredential {
        var credential = GitCredential()
        var lineStart = 0
        while lineStart < input.count {
            var lineEnd = lineStart
            while lineEnd < input.count && input[lineEnd] != UInt8(ascii: "\n") { lineEnd += 1 }
            var contentEnd = lineEnd
            if contentEnd > lineStart && input[contentEnd - 1] == UInt8(ascii: "\r") { contentEnd -= 1 }
            defer { lineStart = lineEnd + 1 }
            if contentEnd - lineStart > maximumLineLength {
                throw ParseError(description: "a credential line is longer than \(maximumLineLength) bytes")
            }
            if contentEnd == lineStart { break }  // a blank line ends the credential
            let line = input[lineStart..<contentEnd]
            guard let equals = line.firstIndex(of: UInt8(ascii: "=")) else {
                throw ParseError(description: "a credential line has no '='")
            }
            if line.contains(0) { throw ParseError(description: "a credential line contains a NUL byte") }
            guard let key = String(validating: line[lineStart..<equals], as: UTF8.self) else {
                throw ParseError(description: "a credential key is not UTF-8")
            }
            let valueBytes = line[(equals + 1)...]
            try credential.set(key, valueBytes)
        }
        return credential
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

    /// `url=scheme://user:password@host:port/path` fills the parts it has, as git does.
    private mutating func apply(url bytes: ArraySlice<UInt8>) throws(ParseError) {
        guard let url = String(validating: bytes, as: UTF8.self) else {
            throw ParseError(description: "the url is not UTF-8")
        }
        guard let schemeEnd = url.firstRange(of: "://") else {
            throw ParseError(description: "the url has no scheme")
        }
        `protocol` = String(url[..<schemeEnd.lowerBound])
        var rest = url[schemeEnd.upperBound...]
        var authority = rest
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            rest = rest[rest.index(after: slash)...]
            path = rest.isEmpty ? nil : String(rest).removingPercentEncodingIfPossible
        } else {
            path = nil
        }
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            authority = authority[authority.index(after: at)...]
            if let colon = userInfo.firstIndex(of: ":") {
                username = String(userInfo[..<colon]).removingPercentEncodingIfPossible
                password = SecretBytes(utf8: String(userInfo[userInfo.index(after: colon)...]).removingPercentEncodingIfPossible)
            } else {
                username = String(userInfo).removingPercentEncodingIfPossible
            }
        }
        host = authority.isEmpty ? nil : String(authority)
    }

    /// The reply to `get`: `username`, `password` and the optional fields, one per line.
    /// Values that contain a newline or end in a carriage return are left out (the protocol
    /// cannot carry them: readers, ``parse(_:)`` and git among them, strip a CR before the LF).
    public func serialized() -> [UInt8] {
        var output: [UInt8] = []
        func line(_ key: String, _ value: [UInt8]) {
            guard !value.contains(UInt8(ascii: "\n")), !value.contains(0), value.last != UInt8(ascii: "\r") else { return }
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

extension String {
    var removingPercentEncodingIfPossible: String {
        guard contains("%" as Character) else { return self }
        var bytes: [UInt8] = []
        var index = utf8.startIndex
        while index < utf8.endIndex {
            let byte = utf8[index]
            if byte == UInt8(ascii: "%"),
                let high = utf8.index(index, offsetBy: 1, limitedBy: utf8.endIndex), high < utf8.endIndex,
                let low = utf8.index(index, offsetBy: 2, limitedBy: utf8.endIndex), low < utf8.endIndex,
                let value = UInt8(String(decoding: [utf8[high], utf8[low]], as: UTF8.self), radix: 16)
            {
                bytes.append(value)
                index = utf8.index(index, offsetBy: 3)
            } else {
                bytes.append(byte)
                index = utf8.index(after: index)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
