/// The one JSON shape the docker credential protocol uses: an object whose values are
/// strings. Values are bytes, so a secret never becomes a `String`. Pure functions, any
/// bytes in: suitable for fuzzing.
public enum FlatJSON {
    public struct ParseError: Error, Sendable, Hashable, CustomStringConvertible {
        public let description: String
    }

    /// Parses `{"key": "value", ...}`. Keys are strings; values are UTF-8 bytes.
    /// - Throws: ``ParseError`` for anything else (nested values, numbers, bad escapes).
    public static func parseObject(_ input: [UInt8]) throws(ParseError) -> [String: [UInt8]] {
        var parser = Parser(input: input)
        let object = try parser.object()
        parser.skipWhitespace()
        guard parser.isAtEnd else { throw ParseError(description: "text after the JSON object") }
        return object
    }

    /// Encodes `pairs` as a JSON object, in the order given.
    public static func encodeObject(_ pairs: [(String, [UInt8])]) -> [UInt8] {
        var output: [UInt8] = [UInt8(ascii: "{")]
        for (index, (key, value)) in pairs.enumerated() {
            if index > 0 { output.append(UInt8(ascii: ",")) }
            appendString(Array(key.utf8), to: &output)
            output.append(UInt8(ascii: ":"))
            appendString(value, to: &output)
        }
        output.append(UInt8(ascii: "}"))
        return output
    }

    private static func appendString(_ value: [UInt8], to output: inout [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        output.append(UInt8(ascii: "\""))
        for byte in value {
            switch byte {
            case UInt8(ascii: "\""): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case UInt8(ascii: "\n"): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case UInt8(ascii: "\r"): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case UInt8(ascii: "\t"): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0..<0x20:
                output.append(contentsOf: Array("\\u00".utf8))
                output.append(hex[Int(byte >> 4)])
                output.append(hex[Int(byte & 0xF)])
            default: output.append(byte)
            }
        }
        output.append(UInt8(ascii: "\""))
    }

    private struct Parser {
        let input: [UInt8]
        var offset = 0

        var isAtEnd: Bool { offset >= input.count }

        mutating func skipWhitespace() {
            while offset < input.count, [0x20, 0x09, 0x0A, 0x0D].contains(input[offset]) { offset += 1 }
        }

        mutating func expect(_ byte: UInt8) throws(ParseError) {
            skipWhitespace()
            guard offset < input.count, input[offset] == byte else {
                throw ParseError(description: "expected '\(Character(Unicode.Scalar(byte)))' at byte \(offset)")
            }
            offset += 1
        }

        mutating func object() throws(ParseError) -> [String: [UInt8]] {
            try expect(UInt8(ascii: "{"))
            var result: [String: [UInt8]] = [:]
            skipWhitespace()
            if offset < input.count, input[offset] == UInt8(ascii: "}") {
                offset += 1
                return result
            }
            while true {
                skipWhitespace()
                let keyBytes = try string()
                guard let key = String(validating: keyBytes, as: UTF8.self) else {
                    throw ParseError(description: "a key is not UTF-8")
                }
                try expect(UInt8(ascii: ":"))
                skipWhitespace()
                result[key] = try string()
                skipWhitespace()
                guard offset < input.count else { throw ParseError(description: "unterminated object") }
                if input[offset] == UInt8(ascii: ",") {
                    offset += 1
                    continue
                }
                try expect(UInt8(ascii: "}"))
                return result
            }
        }

        mutating func string() throws(ParseError) -> [UInt8] {
            guard offset < input.count, input[offset] == UInt8(ascii: "\"") else {
                throw ParseError(description: "expected a string at byte \(offset)")
            }
            offset += 1
            var value: [UInt8] = []
            while offset < input.count {
                let byte = input[offset]
                offset += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return value
                case UInt8(ascii: "\\"):
                    guard offset < input.count else { break }
                    let escape = input[offset]
                    offset += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): value.append(escape)
                    case UInt8(ascii: "b"): value.append(0x08)
                    case UInt8(ascii: "f"): value.append(0x0C)
                    case UInt8(ascii: "n"): value.append(0x0A)
                    case UInt8(ascii: "r"): value.append(0x0D)
                    case UInt8(ascii: "t"): value.append(0x09)
                    case UInt8(ascii: "u"):
                        var scalar = try hex4()
                        if (0xD800..<0xDC00).contains(scalar) {
                            // A high surrogate must be followed by \u and a low one.
                            guard offset + 1 < input.count, input[offset] == UInt8(ascii: "\\"),
                                input[offset + 1] == UInt8(ascii: "u")
                            else { throw ParseError(description: "a lone surrogate in a string") }
                            offset += 2
                            let low = try hex4()
                            guard (0xDC00..<0xE000).contains(low) else {
                                throw ParseError(description: "a lone surrogate in a string")
                            }
                            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let unicode = Unicode.Scalar(scalar) else {
                            throw ParseError(description: "an invalid \\u escape")
                        }
                        value.append(contentsOf: Array(String(Character(unicode)).utf8))
                    default:
                        throw ParseError(description: "an invalid escape in a string")
                    }
                case 0..<0x20:
                    throw ParseError(description: "a control character in a string")
                default:
                    value.append(byte)
                }
            }
            throw ParseError(description: "unterminated string")
        }

        mutating func hex4() throws(ParseError) -> UInt32 {
            guard offset + 4 <= input.count else { throw ParseError(description: "a short \\u escape") }
            var result: UInt32 = 0
            for byte in input[offset..<offset + 4] {
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: throw ParseError(description: "a bad hex digit in a \\u escape")
                }
                result = result << 4 | UInt32(digit)
            }
            offset += 4
            return result
        }
    }
}
