import Foundation
import LockboxTestSupport
import Testing

/// `lockbox` starts for every secret a script or credential helper reads, so it keeps out of
/// its start what the keychain verbs don't use: the HTTP stack (in `lockbox-oauth`) and the
/// dynamically loaded Swift runtime and Foundation (linked statically).
@Suite("lockbox process start")
struct ProcessStartTests {
    let binary = builtProduct("lockbox")
    let oauthBinary = builtProduct("lockbox-oauth")
    let directory = TemporaryDirectory("lockbox-start")

    /// The shared libraries the dynamic loader maps for `path`, as `ldd` lists them.
    func sharedLibraries(_ path: String) throws -> [String] {
        let result = try run("/usr/bin/ldd", [path])
        #expect(result.status == 0, "ldd \(path): \(result.standardError)")
        return result.standardOutput.split(separator: "\n").compactMap { line in
            line.split(separator: " ").first.map { String($0.trimmingCharacters(in: .whitespaces)) }
        }
    }

    @Test(
        "lockbox and the credential helpers load no Swift runtime, Foundation, HTTP stack, SQLite, libsodium, libcrypto or tss2 as shared libraries",
        arguments: ["lockbox", "git-credential-lockbox", "docker-credential-lockbox"])
    func startsLean(_ product: String) throws {
        let libraries = try sharedLibraries(builtProduct(product))
        #expect(libraries.contains { $0.hasPrefix("libc.so") }, "ldd output not understood: \(libraries)")
        let unwantedLibraries = [
            "libcurl", "libFoundationNetworking", "libFoundation.so", "libswiftCore", "libgnutls", "lib_FoundationICU",
            // Linked from their static archives.
            "libsqlite3", "libsodium", "libkeyutils",
            // Only lockbox-keys loads them, for the key verbs and the TPM.
            "libcrypto", "libtss2",
        ]
        for unwanted in unwantedLibraries {
            #expect(!libraries.contains { $0.hasPrefix(unwanted) }, "\(product) links \(unwanted): \(libraries)")
        }
    }

    @Test(
        "lockbox and the credential helpers link FoundationEssentials only, not CoreFoundation and its ICU data",
        arguments: ["lockbox", "git-credential-lockbox", "docker-credential-lockbox"])
    func linksNoCoreFoundation(_ product: String) throws {
        // Static linking takes only the archive members something refers to: one call into
        // swift-corelibs-foundation (an NSString method, FileHandle, a DateFormatter) brings in
        // CoreFoundation, its start-up initialiser and 30 MB of ICU data.
        let symbols = try run("/usr/bin/nm", ["--defined-only", builtProduct(product)])
        #expect(symbols.status == 0, "nm: \(symbols.standardError)")
        #expect(symbols.standardOutput.contains("FoundationEssentials"), "nm output not understood")
        let linksCoreFoundation = symbols.standardOutput.contains("__CFInitialize")
        #expect(!linksCoreFoundation, "\(product) links CoreFoundation")
    }

    @Test("lockbox-oauth is where the HTTP stack is")
    func oauthHelper_hasTheHTTPStack() throws {
        #expect(try sharedLibraries(oauthBinary).contains { $0.hasPrefix("libFoundationNetworking") })
    }

    @Test("the OAuth verbs run lockbox-oauth beside lockbox, with the same arguments and environment")
    func oauthVerbs_runTheHelper() throws {
        let keychain = directory.file("keychains/start.lockbox")
        let initialized = try run(binary, ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: Array("start passphrase\n".utf8))
        #expect(initialized.status == 0, "init: \(initialized.standardError)")
        defer { _ = try? run(binary, ["--keychain", keychain, "lock", "--all"]) }
        let status = try run(binary, ["--keychain", keychain, "auth", "status", "--json"])
        #expect(status.status == 0, "auth status: \(status.standardError)")
        #expect(status.standardOutput.contains("\"sessions\""))

        let wrongProgram = try run(oauthBinary, ["--keychain", keychain, "find-generic-password", "-s", "x"])
        #expect(wrongProgram.status == 64)
        #expect(wrongProgram.standardError.contains("run the others with `lockbox`"))
    }

    @Test("without lockbox-oauth beside it, lockbox says which program is missing and how to build it")
    func missingHelper_isNamed() throws {
        let lonely = directory.file("bin/lockbox")
        try FileManager.default.createDirectory(atPath: directory.file("bin"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: binary, toPath: lonely)
        let result = try run(lonely, ["--keychain", directory.file("none.lockbox"), "login", "--issuer", "https://example.invalid", "--client-id", "c"])
        #expect(result.status == 1)
        #expect(result.standardError.contains("lockbox-oauth, which is not installed beside this lockbox"))
        #expect(result.standardError.contains("swift build -c release --product lockbox-oauth"))
        // The keychain verbs don't need it.
        #expect(try run(lonely, ["--version"]).status == 0)
    }
}
