import Foundation
import Lockbox

#if canImport(Glibc)
import Glibc
#endif

// The in-process side of scripts/compare-peers: stores then reads N small generic passwords
// through the public `Keychain.open` API, timing each operation, and prints the latencies as
// JSON on standard output. Deletes what it stored afterwards (untimed).
//
//   lockbox-peer-bench --backend vault|secret-service [--keychain PATH] [--count N] [--service NAME]

func usage() -> Never {
    FileHandle.standardError.write(
        Data("usage: lockbox-peer-bench --backend vault|secret-service [--keychain PATH] [--count N] [--service NAME]\n".utf8))
    exit(64)
}

var backend: Keychain.Backend?
var keychain: String?
var count = 1_000
var service = "lockbox-peer-bench"
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--backend": backend = arguments.next().flatMap(Keychain.Backend.init(rawValue:))
    case "--keychain": keychain = arguments.next()
    case "--count": count = arguments.next().flatMap { Int($0) } ?? count
    case "--service": service = arguments.next() ?? service
    default: usage()
    }
}
guard let backend else { usage() }

func nanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

do {
    let store = try Keychain.open(Keychain.Options(backend: backend, path: keychain)).store
    var stores: [UInt64] = []
    var reads: [UInt64] = []
    for index in 0..<count {
        let item = Item.genericPassword(
            service: service, account: "account-\(index)", data: SecretBytes(utf8: "secret-value-\(index)-0123456789abcdef"))
        let start = nanoseconds()
        try store.add(item)
        stores.append(nanoseconds() - start)
    }
    for index in 0..<count {
        let start = nanoseconds()
        let data = try store.data(matching: .genericPassword(service: service, account: "account-\(index)"))
        reads.append(nanoseconds() - start)
        precondition(data.count > 0)
    }
    for index in 0..<count {
        try store.delete(matching: .genericPassword(service: service, account: "account-\(index)"))
    }
    let json = "{\"store\": [\(stores.map(String.init).joined(separator: ","))], \"read\": [\(reads.map(String.init).joined(separator: ","))]}\n"
    FileHandle.standardOutput.write(Data(json.utf8))
} catch {
    FileHandle.standardError.write(Data("lockbox-peer-bench: \(error)\n".utf8))
    exit(1)
}
