import Foundation
import Lockbox
import LockboxAuth

// `lockbox-stress churn`: the writer the crash campaign kills. It runs random operations on a
// vault until killed and prints, unbuffered, one line before each call ("begin OP ARGS") and
// one after it returned ("ok OP ARGS"). The driver treats a "begin" without its "ok" as a write
// in flight (old or new value acceptable) and an "ok" as acknowledged (must survive the kill).
//
//   lockbox-stress churn --keychain PATH --device-key PATH --backups DIR --focus OP [--operations N]
//   (standard input: the current passphrase, one line)
//
// OP is add, update, delete, passphrase, backup or rotate: three operations in four are OP, the
// fourth is picked at random.

/// The keys the campaign writes (service "crash"), few enough that updates and deletes hit.
let churnKeys = (0..<48).map { "k\($0)" }
let churnOperations = ["add", "update", "delete", "passphrase", "backup", "rotate"]

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func churn(_ options: [String: String]) throws(LockboxError) {
    guard let path = options["--keychain"], let deviceKey = options["--device-key"], let backups = options["--backups"],
        let focus = options["--focus"], churnOperations.contains(focus)
    else {
        fail("usage: lockbox-stress churn --keychain PATH --device-key PATH --backups DIR --focus OP [--operations N]")
    }
    let limit = options["--operations"].flatMap(Int.init) ?? Int.max
    guard let line = readLine(strippingNewline: true), !line.isEmpty else { fail("churn: the passphrase is expected on stdin") }
    var passphrase = line

    var configuration = Vault.Configuration()
    configuration.keyDerivation = .interactive
    configuration.device = DeviceIdentity(keyPath: deviceKey)
    let vault = try Vault.open(at: path, configuration: configuration)
    let tokens = ItemStoreTokenStore(
        store: vault, key: CredentialKey(issuer: "https://issuer.invalid", clientID: "crash-campaign"))
    var all = Query(.genericPassword, limit: .all, returning: .attributes)
    all.attributes.service = "crash"
    var present: Set<String> = []
    do {
        present = Set(try vault.items(matching: all).compactMap(\.attributes.account))
    } catch LockboxError.itemNotFound {}
    say("ready")

    for _ in 0..<limit {
        // Slow operations (Argon2id, whole-vault backups) mix in only when they are the focus, so
        // the kills spread over every kind of write instead of landing mostly in the slow ones.
        let quick = ["add", "update", "delete", "rotate"]
        var operation = Int.random(in: 0..<4) == 0 ? (quick.contains(focus) ? quick : churnOperations).randomElement()! : focus
        if operation == "add" && present.count == churnKeys.count { operation = "update" }
        if (operation == "update" || operation == "delete") && present.isEmpty { operation = "add" }
        let tag = UInt64.random(in: 0...UInt64.max)
        switch operation {
        case "add":
            let key = churnKeys.filter { !present.contains($0) }.randomElement()!
            let value = "v-\(key)-\(tag)"
            say("begin add \(key) \(value)")
            try vault.add(.genericPassword(service: "crash", account: key, data: SecretBytes(utf8: value)))
            present.insert(key)
            say("ok add \(key) \(value)")
        case "update":
            let key = present.randomElement()!
            let value = "v-\(key)-\(tag)"
            say("begin update \(key) \(value)")
            try vault.update(matching: .genericPassword(service: "crash", account: key), to: ItemUpdate(data: SecretBytes(utf8: value)))
            say("ok update \(key) \(value)")
        case "delete":
            let key = present.randomElement()!
            say("begin delete \(key) -")
            try vault.delete(matching: .genericPassword(service: "crash", account: key))
            present.remove(key)
            say("ok delete \(key) -")
        case "passphrase":
            let new = "pp-\(tag)"
            say("begin passphrase - \(new)")
            try vault.changePassphrase(from: SecretBytes(utf8: passphrase), to: SecretBytes(utf8: new))
            passphrase = new
            say("ok passphrase - \(new)")
        case "backup":
            let file = backups + "/b-\(tag).lbx"
            say("begin backup \(file) -")
            let summary = try vault.backup(to: file, passphrase: SecretBytes(utf8: "campaign-backup"), replacing: true)
            say("ok backup \(file) \(summary.exported)")
        default:
            let token = "rt-\(tag)"
            say("begin rotate - \(token)")
            try tokens.saveRefreshToken(SecretBytes(utf8: token))
            say("ok rotate - \(token)")
        }
    }
}
