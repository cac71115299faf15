// What docs/AUTH.md's example takes from its surroundings: a logger and the API's address.
import Foundation

struct ExampleLogger {
    func info(_ message: String) { print(message) }
}

let logger = ExampleLogger()
let apiURL = URL(string: "https://api.example.com/resource")!
