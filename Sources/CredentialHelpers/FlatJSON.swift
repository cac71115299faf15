/// The JSON the docker credential protocol uses: objects whose values docker reads as
/// strings. Values are bytes, so a secret never becomes a `String`. Pure functions, any bytes
/// in: suitable for fuzzing.
///
/// The reader follows Go's `encoding/json`, which docker's own helpers decode with: members of
/// any type are read (and skipped where nobody wants them), `null` is a value, a lone UTF-16
/// surrogate in a `\u` escape reads as U+FFFD, and nesting is bounded (10,000 levels, Go's limit).
public enum FlatJSON {
    public struct ParseError: Error, Sendable, Hashable, CustomStringConvertible {
        public let description: String
    }

    /// A member's value as far as the docker protocol cares.
    public enum Value: Sendable, Hashable {
        case string([UInt8])
        case null
        /// A number, `true`, `false`, an object or an array: checked as JSON, then skipped.
        case other
    }

    /// One `"key": value` of an object, in the order the input gives them.
    public struct Member: Sendable, Hashable {
        public var key: String
        public var value: Value
    }

    /// Go's nesting limit (`maxNestingDepth` in encoding/json).
    public static let maximumDepth = 10_000

    /// Parses `{"key": "value", ...}` that is the whole input. Keys are strings; values are
    /// UTF-8 bytes; a repeated key keeps its last value.
    /// - Throws: ``ParseError`` for anything else (values that are not strings, bad escapes,
    ///   text after the object).
    public static func parseObject(_ input: [UInt8]) throws(ParseError) -> [String: [UInt8]] {
        var parser = Parser(input: input)
        let members = try parser.object()
        parser.skipWhitespace()
        guard parser.isAtEnd else { throw ParseError(description: "text after the JSON object") }
        var object: [String: [UInt8]] = [:]
        for member in members {
            guard case .string(let value) = member.value else {
                throw ParseError(description: "a value that is not a string")
            }
            object[member.key] = value
        }
        return object
    }

    /// The members of the first JSON value in `input`, as Go's `json.Decoder.Decode` reads
    /// it: an object gives its members in order, `null` gives none; whatever follows the value
    /// is not read.
    /// - Throws: ``ParseError`` for empty input, a first value that is not an object or
    ///   `null`, or malformed JSON up to the end of that value.
    public static func parseFirstObject(_ input: [UInt8]) throws(ParseError) -> [Member] {
        var parser = Parser(input: input)
        parser.skipWhitespace()
        if parser.consume(literal: "null") { return [] }
        return try parser.object()
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

        /// Consumes `literal` when the input continues with it.
        mutating func consume(literal: StaticString) -> Bool {
            let count = literal.utf8CodeUnitCount
            guard offset + count <= input.count else { return false }
            let matches = literal.withUTF8Buffer { expected in
                (0..<count).allSatisfy { input[offset + $0] == expected[$0] }
            }
            if matches { offset += count }
            return matches
        }

        mutating func object() throws(ParseError) -> [Member] {
            try expect(UInt8(ascii: "{"))
            var result: [Member] = []
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
                result.append(Member(key: key, value: try value()))
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

        /// One value at the current offset: strings and `null` are kept; anything else is
        /// checked and skipped.
        mutating func value() throws(ParseError) -> Value {
            guard offset < input.count else { throw ParseError(description: "a value is missing at the end") }
            switch input[offset] {
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "n"):
                guard consume(literal: "null") else { throw ParseError(description: "an invalid literal at byte \(offset)") }
                return .null
            default:
                try skipValue()
                return .other
            }
        }

        /// Skips one value of any kind without recursion: nesting is counted, not stacked on
        /// the call stack.
        mutating func skipValue() throws(ParseError) {
            // true for an object (whose members need keys), false for an array.
            var open: [Bool] = []
            repeat {
                skipWhitespace()
                guard offset < input.count else { throw ParseError(description: "unterminated value") }
                let byte = input[offset]
                if byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[") {
                    guard open.count < FlatJSON.maximumDepth else {
                        throw ParseError(description: "values nested deeper than \(FlatJSON.maximumDepth) levels")
                    }
                    offset += 1
                    open.append(byte == UInt8(ascii: "{"))
                    skipWhitespace()
                    if offset < input.count, input[offset] == (open.last! ? UInt8(ascii: "}") : UInt8(ascii: "]")) {
                        offset += 1
                        open.removeLast()
                    } else {
                        if open.last! { try memberKey() }
                        continue
                    }
                } else {
                    try scalar()
                }
                // After a value: a comma continues the innermost container, its bracket ends it.
                while let isObject = open.last {
                    skipWhitespace()
                    guard offset < input.count else { throw ParseError(description: "unterminated value") }
                    if input[offset] == UInt8(ascii: ",") {
                        offset += 1
                        if isObject { try memberKey() }
                        break
                    }
                    try expect(isObject ? UInt8(ascii: "}") : UInt8(ascii: "]"))
                    open.removeLast()
                }
            } while !open.isEmpty
        }

        /// `"key":` inside an object being skipped.
        mutating func memberKey() throws(ParseError) {
            skipWhitespace()
            _ = try string()
            try expect(UInt8(ascii: ":"))
        }

        /// A string, number or literal.
        mutating func scalar() throws(ParseError) {
            guard offset < input.count else { throw ParseError(description: "a value is missing at the end") }
            switch input[offset] {
            case UInt8(ascii: "\""): _ = try string()
            case UInt8(ascii: "t"): guard consume(literal: "true") else { throw invalid() }
            case UInt8(ascii: "f"): guard consume(literal: "false") else { throw invalid() }
            case UInt8(ascii: "n"): guard consume(literal: "null") else { throw invalid() }
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try number()
            default: throw invalid()
            }
        }

        func invalid() -> ParseError {
            ParseError(description: "an invalid value at byte \(offset)")
        }

        /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
        mutating func number() throws(ParseError) {
            func digits() -> Int {
                let start = offset
                while offset < input.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(input[offset]) { offset += 1 }
                return offset - start
            }
            if input[offset] == UInt8(ascii: "-") { offset += 1 }
            guard offset < input.count else { throw invalid() }
            if input[offset] == UInt8(ascii: "0") {
                offset += 1
            } else if digits() == 0 {
                throw invalid()
            }
            if offset < input.count, input[offset] == UInt8(ascii: ".") {
                offset += 1
                guard digits() > 0 else { throw invalid() }
            }
            if offset < input.count, input[offset] == UInt8(ascii: "e") || input[offset] == UInt8(ascii: "E") {
                offset += 1
                if offset < input.count, input[offset] == UInt8(ascii: "+") || input[offset] == UInt8(ascii: "-") {
                    offset += 1
                }
                guard digits() > 0 else { throw invalid() }
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
                            // A high surrogate followed by \u and a low one is one character;
                            // alone, it is U+FFFD, as Go reads it.
                            let mark = offset
                            if offset + 1 < input.count, input[offset] == UInt8(ascii: "\\"),
                                input[offset + 1] == UInt8(ascii: "u")
                            {
                                offset += 2
                                let low = try hex4()
                                if (0xDC00..<0xE000).contains(low) {
                                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                                } else {
                                    offset = mark
                                    scalar = 0xFFFD
                                }
                            } else {
                                scalar = 0xFFFD
                            }
                        }
                        let unicode = Unicode.Scalar(scalar) ?? "\u{FFFD}"
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
