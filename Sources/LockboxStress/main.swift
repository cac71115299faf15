import Foundation
import Lockbox

// A writer process for the concurrency and crash campaigns: several of these write to one
// vault at once. It prints one line per acknowledged write ("ok ACCOUNT"), so a driver that
// kills it knows exactly which writes were acknowledged.
//
//   lockbox-stress write --keychain PATH --prefix P --count N [--update-every K]
//   lockbox-stress churn ...   (the crash campaign's writer: Churn.swift)

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("lockbox-stress: \(message)\n".utf8))
    exit(1)
}

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "churn" {
    var churnOptions: [String: String] = [:]
    for index in stride(from: 1, to: arguments.count - 1, by: 2) { churnOptions[arguments[index]] = arguments[index + 1] }
    do { try churn(churnOptions) } catch { fail(error.description) }
    exit(0)
}
guard arguments.first == "write" else { fail("usage: lockbox-stress write --keychain PATH --prefix P --count N") }
arguments.removeFirst()
var options: [String: String] = [:]
while arguments.count >= 2 {
    options[arguments.removeFirst()] = arguments.removeFirst()
}
guard let path = options["--keychain"], let prefix = options["--prefix"], let count = options["--count"].flatMap(Int.init) else {
    fail("usage: lockbox-stress write --keychain PATH --prefix P --count N")
}

do {
    let vault = try Vault.open(at: path)
    for index in 0..<count {
        let account = "\(prefix)-\(index)"
        let value = SecretBytes(utf8: "value-\(account)")
        try vault.add(.genericPassword(service: "stress", account: account, data: value))
        // A shared item every writer updates: contention on one row.
        let shared = Query.genericPassword(service: "stress-shared", account: "counter")
        do {
            try vault.update(matching: shared, to: ItemUpdate(data: SecretBytes(utf8: account)))
        } catch LockboxError.itemNotFound {
            do {
                try vault.add(.genericPassword(service: "stress-shared", account: "counter", data: SecretBytes(utf8: account)))
            } catch LockboxError.duplicateItem {
                try vault.update(matching: shared, to: ItemUpdate(data: SecretBytes(utf8: account)))
            }
        }
        FileHandle.standardOutput.write(Data("ok \(account)\n".utf8))
    }
} catch {
    fail(error.description)
}
