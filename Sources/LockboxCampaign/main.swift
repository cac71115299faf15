import Foundation
import LockboxCampaigns

// The reliability campaigns' driver (docs/RELIABILITY.md is written by scripts/campaign).
//
//   lockbox-campaign crash --iterations N --writer PATH/lockbox-stress [--directory DIR]
//   lockbox-campaign faults
//   lockbox-campaign leaks --lockbox PATH/lockbox
//   lockbox-campaign tamper [--sample]
//   lockbox-campaign sync --iterations N --lockbox PATH/lockbox [--postgres scripts/postgres]   (LOCKBOX_TEST_POSTGRES: scripts/postgres start)
//
// Prints a summary; exits 1 when any check failed.

func usage() -> Never {
    FileHandle.standardError.write(
        Data(
            ("usage: lockbox-campaign crash --iterations N --writer PATH | faults | leaks --lockbox PATH | tamper [--sample]"
                + " | sync --iterations N --lockbox PATH [--postgres SCRIPT]\n").utf8))
    exit(64)
}

// Children are killed on purpose: a write to one that is gone must fail, not kill the driver.
signal(SIGPIPE, SIG_IGN)

var arguments = Array(CommandLine.arguments.dropFirst())
guard let verb = arguments.first else { usage() }
var options: [String: String] = [:]
for index in stride(from: 1, to: arguments.count - 1, by: 2) { options[arguments[index]] = arguments[index + 1] }

func temporaryDirectory() -> String {
    var template = Array("/tmp/lockbox-campaign-XXXXXX".utf8CString)
    let created = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    guard created != nil else { usage() }
    return String(cString: template.withUnsafeBufferPointer { $0.baseAddress! })
}

do {
    switch verb {
    case "crash":
        guard let iterations = options["--iterations"].flatMap(Int.init), let writer = options["--writer"] else { usage() }
        let directory = options["--directory"] ?? temporaryDirectory()
        defer { if options["--directory"] == nil { try? FileManager.default.removeItem(atPath: directory) } }
        let report = try CrashCampaign.run(CrashCampaign.Options(iterations: iterations, writer: writer, directory: directory)) {
            FileHandle.standardError.write(Data("  \($0)\n".utf8))
        }
        print(report.summary)
        exit(report.violations.isEmpty ? 0 : 1)
    case "faults":
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let report = try FaultCampaign.run(directory: directory)
        print(report.summary)
        exit(report.violations.isEmpty ? 0 : 1)
    case "leaks":
        guard let lockbox = options["--lockbox"] else { usage() }
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let report = try LeakCampaign.run(lockbox: lockbox, directory: directory)
        print(report.summary)
        exit(report.hits.isEmpty && report.failures.isEmpty ? 0 : 1)
    case "tamper":
        let sample = arguments.dropFirst().contains("--sample")
        guard arguments.count == 1 || (arguments.count == 2 && sample) else { usage() }
        let directory = temporaryDirectory()
        // With LOCKBOX_CAMPAIGN_TRACE set, each edit goes to standard error before it is tried,
        // so a crash names it.
        let trace = ProcessInfo.processInfo.environment["LOCKBOX_CAMPAIGN_TRACE"] != nil
        let outcome = Result {
            try TamperCampaign.run(TamperCampaign.Options(directory: directory, sample: sample) { edit in
                if trace { FileHandle.standardError.write(Data("  edit: \(edit)\n".utf8)) }
            })
        }
        // exit() runs no defer: the directory goes first.
        try? FileManager.default.removeItem(atPath: directory)
        let report = try outcome.get()
        print(report.summary)
        exit(report.totals.violations == 0 ? 0 : 1)
    case "sync":
        guard let iterations = options["--iterations"].flatMap(Int.init), let lockbox = options["--lockbox"] else { usage() }
        guard let database = ProcessInfo.processInfo.environment["LOCKBOX_TEST_POSTGRES"] else {
            FileHandle.standardError.write(Data("lockbox-campaign sync: set LOCKBOX_TEST_POSTGRES to a connection string (scripts/postgres start)\n".utf8))
            exit(64)
        }
        let directory = temporaryDirectory()
        // `--postgres SCRIPT`: the database is the campaign's own (scripts/postgres, with
        // LOCKBOX_POSTGRES_STATE), which it may crash mid-sync and start again.
        let outcome = Result {
            try SyncCrashCampaign.run(
                SyncCrashCampaign.Options(
                    iterations: iterations, lockbox: lockbox, database: database, directory: directory, postgresScript: options["--postgres"])
            ) {
                FileHandle.standardError.write(Data("  \($0)\n".utf8))
            }
        }
        // exit() runs no defer: the directory goes first.
        try? FileManager.default.removeItem(atPath: directory)
        let report = try outcome.get()
        print(report.summary)
        exit(report.violations.isEmpty ? 0 : 1)
    default:
        usage()
    }
} catch {
    FileHandle.standardError.write(Data("lockbox-campaign: \(error)\n".utf8))
    exit(1)
}
