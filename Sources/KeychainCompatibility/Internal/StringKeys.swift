#if !canImport(Darwin)
import Foundation

// The `kSec*` constants are `CFString` objects, as on Apple platforms; the dictionaries read here
// are keyed by Swift strings. These let the two meet without `as String` at every comparison.

func == (lhs: String, rhs: CFString) -> Bool { lhs == rhs as String }
func == (lhs: String?, rhs: CFString) -> Bool { lhs.map { $0 == rhs } ?? false }
func != (lhs: String, rhs: CFString) -> Bool { !(lhs == rhs) }
func ~= (pattern: CFString, value: String) -> Bool { value == pattern }

extension Dictionary where Key == String {
    subscript(key: CFString) -> Value? {
        get { self[key as String] }
        set { self[key as String] = newValue }
    }
}

extension Set where Element == String {
    init(_ constants: [CFString]) {
        self.init(constants.map { $0 as String })
    }

    func contains(_ constant: CFString) -> Bool { contains(constant as String) }
}

extension NSDictionary {
    /// The dictionary with its keys as Swift strings; nil when a key is not a string (or is a nil
    /// optional, as `[String?: AnyObject]` allows), which no Security function accepts.
    var stringKeyed: [String: Any]? {
        var result: [String: Any] = [:]
        for (key, value) in self {
            guard let name = QueryValue.string(key) else { return nil }
            result[name] = value
        }
        return result
    }
}
#endif

#if !canImport(Darwin)
func ~= (pattern: CFString, value: String?) -> Bool { value == pattern }
#endif
