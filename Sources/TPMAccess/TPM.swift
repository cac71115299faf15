internal import CTss2Loader
import LockboxCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A TPM 2.0, reached through the tss2 ESAPI libraries: keys made inside it, signatures by
/// them, and small secrets sealed to it (optionally to the current values of some PCRs).
///
/// Everything the TPM makes lives under its storage primary key (an ECC P-256 key of the owner
/// hierarchy, made again from the TPM's own seed on each connection, as `tpm2_createprimary`'s
/// default does): a key or sealed secret leaves the TPM only wrapped by that key, so the blobs
/// are of no use to any other TPM.
///
/// One connection per device and process; calls are serialized (ESAPI contexts are not thread
/// safe). A connection that fails at the transport (the TPM disappeared) is dropped, and the
/// next call connects again.
package final class TPM: Sendable {
    /// Where the TPM is: a TCTI configuration string (`device:/dev/tpmrm0`,
    /// `swtpm:host=127.0.0.1,port=2321`).
    package let device: String

    /// Only touched inside `connection`'s lock.
    private struct Connection: @unchecked Sendable {
        var esys: OpaquePointer
        var tcti: OpaquePointer
        var primary: ESYS_TR?
        /// Loaded keys, by their wrapped blob: loading costs as much as a signature.
        var loaded: [[UInt8]: ESYS_TR] = [:]
        /// Set when the transport failed: the connection is closed and dropped.
        var isClosed = false
    }

    private let connection = Mutex<Connection?>(nil)

    private static let shared = Mutex<[String: TPM]>([:])

    private init(device: String) {
        self.device = device
    }

    /// The TCTI configuration used when none is given: `LOCKBOX_TPM_TCTI`, else the kernel's
    /// resource manager `/dev/tpmrm0`.
    package static var defaultDevice: String {
        if let configured = ProcessEnvironment.value("LOCKBOX_TPM_TCTI"), !configured.isEmpty { return configured }
        return "device:/dev/tpmrm0"
    }

    /// The process's connection to `device` (nil: ``defaultDevice``). Connecting happens on first use.
    package static func at(_ device: String? = nil) -> TPM {
        let device = device ?? defaultDevice
        return shared.withLock { all in
            if let existing = all[device] { return existing }
            let made = TPM(device: device)
            all[device] = made
            return made
        }
    }

    /// Whether this TPM can make keys now, and if not why. Connects (and makes the storage
    /// key) to find out.
    package func availability() -> (isAvailable: Bool, reason: String) {
        if device.hasPrefix("device:") || !device.utf8.contains(UInt8(ascii: ":")) {
            let path = device.hasPrefix("device:") ? String(device.dropFirst("device:".count)) : device
            let node = path.isEmpty ? "/dev/tpmrm0" : path
            if access(node, F_OK) != 0 {
                return (false, "This machine has no TPM 2.0 (\(node) does not exist).")
            }
            if access(node, R_OK | W_OK) != 0 {
                return (
                    false,
                    "The TPM \(node) is not open to this user (add the user to the tss group, or run as root)."
                )
            }
        }
        do {
            try withConnection { (connection) throws(LockboxError) in _ = try primaryKey(&connection) }
            return (true, "TPM 2.0 at \(device)")
        } catch {
            return (false, error.message)
        }
    }

    // MARK: Keys

    /// A new ECDSA P-256 signing key made inside the TPM.
    /// - Returns: the key's blobs (the private one wrapped by the storage key) and its public
    ///   point, X9.63 uncompressed.
    package func makeSigningKey() throws(LockboxError) -> (blob: [UInt8], publicKey: [UInt8]) {
        try withConnection { (connection) throws(LockboxError) in
            let parent = try primaryKey(&connection)
            var sensitive = TPM2B_SENSITIVE_CREATE()
            var template = TPM2B_PUBLIC()
            template.publicArea.type = Constant.algorithmECC
            template.publicArea.nameAlg = Constant.algorithmSHA256
            template.publicArea.objectAttributes =
                Constant.fixedTPM | Constant.fixedParent | Constant.sensitiveDataOrigin | Constant.userWithAuth | Constant.noDA
                | Constant.sign
            template.publicArea.parameters.eccDetail.symmetric.algorithm = Constant.algorithmNull
            template.publicArea.parameters.eccDetail.scheme.scheme = Constant.algorithmECDSA
            template.publicArea.parameters.eccDetail.scheme.details.ecdsa.hashAlg = Constant.algorithmSHA256
            template.publicArea.parameters.eccDetail.curveID = Constant.curveP256
            template.publicArea.parameters.eccDetail.kdf.scheme = Constant.algorithmNull
            let (outPublic, outPrivate) = try create(under: parent, sensitive: &sensitive, template: &template, "key", &connection)
            let point = outPublic.publicArea.unique.ecc
            let x = Self.bytes(of: point.x)
            let y = Self.bytes(of: point.y)
            guard x.count <= 32, y.count <= 32 else { throw Self.failure("the TPM returned a point that is not P-256") }
            let publicKey = [0x04] + [UInt8](repeating: 0, count: 32 - x.count) + x + [UInt8](repeating: 0, count: 32 - y.count) + y
            return (try Self.marshal(public: outPublic, private: outPrivate), publicKey)
        }
    }

    /// An ECDSA signature by the key in `blob` of the SHA-256 `digest`.
    /// - Returns: the signature's `r` and `s`, 32 bytes each.
    package func sign(digest: [UInt8], blob: [UInt8]) throws(LockboxError) -> (r: [UInt8], s: [UInt8]) {
        precondition(digest.count == 32, "a SHA-256 digest")
        return try withConnection { (connection) throws(LockboxError) in
            let handle = try loadedKey(blob, &connection)
            var toSign = TPM2B_DIGEST()
            toSign.size = 32
            Self.copy(digest, into: &toSign.buffer)
            var scheme = TPMT_SIG_SCHEME()
            scheme.scheme = Constant.algorithmECDSA
            scheme.details.ecdsa.hashAlg = Constant.algorithmSHA256
            var validation = TPMT_TK_HASHCHECK()
            validation.tag = Constant.hashCheckTag
            validation.hierarchy = Constant.nullHierarchy
            var signature: UnsafeMutablePointer<TPMT_SIGNATURE>?
            let result = Self.tss2.Esys_Sign(connection.esys, handle, Constant.password, Constant.none, Constant.none, &toSign, &scheme, &validation, &signature)
            defer { Self.tss2.Esys_Free(signature) }
            try check(result, "Esys_Sign", &connection)
            guard let signature, signature.pointee.sigAlg == Constant.algorithmECDSA else {
                throw Self.failure("Esys_Sign returned no ECDSA signature")
            }
            return (Self.bytes(of: signature.pointee.signature.ecdsa.signatureR), Self.bytes(of: signature.pointee.signature.ecdsa.signatureS))
        }
    }

    /// The benchmark's reference (`lockbox-key-bench`): `Esys_Sign` alone, as `tpm2_sign` calls
    /// it, on a key loaded beforehand, with none of the lookups `sign(digest:blob:)` makes.
    package func referenceSigner(blob: [UInt8]) throws(LockboxError) -> () -> Void {
        let handle = try withConnection { (connection) throws(LockboxError) in try loadedKey(blob, &connection) }
        var digest = TPM2B_DIGEST()
        digest.size = 32
        var scheme = TPMT_SIG_SCHEME()
        scheme.scheme = Constant.algorithmECDSA
        scheme.details.ecdsa.hashAlg = Constant.algorithmSHA256
        var validation = TPMT_TK_HASHCHECK()
        validation.tag = Constant.hashCheckTag
        validation.hierarchy = Constant.nullHierarchy
        let esys = connection.withLock { $0!.esys }
        return {
            var signature: UnsafeMutablePointer<TPMT_SIGNATURE>?
            let result = Self.tss2.Esys_Sign(esys, handle, Constant.password, Constant.none, Constant.none, &digest, &scheme, &validation, &signature)
            precondition(result == 0, "Esys_Sign failed")
            Self.tss2.Esys_Free(signature)
        }
    }

    /// Extends the SHA-256 bank of PCR `index` with `digest` (32 bytes), as a boot step measures
    /// what it loads: the tests' stand-in for a changed boot chain.
    package func extendPCR(_ index: Int, digest: [UInt8]) throws(LockboxError) {
        precondition((0..<24).contains(index) && digest.count == 32)
        try withConnection { (connection) throws(LockboxError) in
            var values = TPML_DIGEST_VALUES()
            values.count = 1
            values.digests.0.hashAlg = Constant.algorithmSHA256
            Self.copy(digest, into: &values.digests.0.digest.sha256)
            let result = Self.tss2.Esys_PCR_Extend(connection.esys, ESYS_TR(index), Constant.password, Constant.none, Constant.none, &values)
            try check(result, "Esys_PCR_Extend", &connection)
        }
    }

    /// Unloads the key in `blob` if it is loaded (after its item was deleted).
    package func forget(blob: [UInt8]) {
        connection.withLock { connection in
            guard var current = connection, let handle = current.loaded.removeValue(forKey: blob) else { return }
            _ = Self.tss2.Esys_FlushContext(current.esys, handle)
            connection = current
        }
    }

    // MARK: Sealing

    /// `secret` (at most 128 bytes) sealed to this TPM, and when `pcrs` is not empty to the
    /// current values of those SHA-256 PCRs: only this TPM, in that state, unseals it.
    package func seal(_ secret: SecretBytes, pcrs: [Int]) throws(LockboxError) -> [UInt8] {
        guard secret.count <= 128, !secret.isEmpty else { throw LockboxError(.param, "A sealed secret is 1 to 128 bytes.") }
        guard pcrs.allSatisfy({ (0..<24).contains($0) }) else {
            throw LockboxError(.param, "PCR numbers run from 0 to 23.")
        }
        return try withConnection { (connection) throws(LockboxError) in
            let parent = try primaryKey(&connection)
            var template = TPM2B_PUBLIC()
            template.publicArea.type = Constant.algorithmKeyedHash
            template.publicArea.nameAlg = Constant.algorithmSHA256
            template.publicArea.objectAttributes = Constant.fixedTPM | Constant.fixedParent | Constant.noDA
            template.publicArea.parameters.keyedHashDetail.scheme.scheme = Constant.algorithmNull
            if pcrs.isEmpty {
                template.publicArea.objectAttributes |= Constant.userWithAuth
            } else {
                let policy = try policyDigest(pcrs: pcrs, trial: true, &connection)
                template.publicArea.authPolicy = policy.digest
                _ = Self.tss2.Esys_FlushContext(connection.esys, policy.session)
            }
            var sensitive = TPM2B_SENSITIVE_CREATE()
            secret.withUnsafeBytes { bytes in
                sensitive.sensitive.data.size = UInt16(bytes.count)
                withUnsafeMutableBytes(of: &sensitive.sensitive.data.buffer) { $0.copyMemory(from: bytes) }
            }
            defer { withUnsafeMutableBytes(of: &sensitive) { sodiumStyleWipe($0) } }
            let (outPublic, outPrivate) = try create(under: parent, sensitive: &sensitive, template: &template, "sealed object", &connection)
            let blob = try Self.marshal(public: outPublic, private: outPrivate)
            return [UInt8(pcrs.count)] + pcrs.map(UInt8.init) + blob
        }
    }

    /// The secret in a blob made by ``seal(_:pcrs:)``.
    /// - Throws: `authFailed` when the PCRs no longer have the values it was sealed to, or the
    ///   blob belongs to another TPM; `notAvailable` when the TPM cannot be reached.
    package func unseal(_ sealed: [UInt8]) throws(LockboxError) -> SecretBytes {
        let (pcrs, blob) = try Self.splitSealed(sealed)
        let (inPublic, inPrivate) = try Self.unmarshal(blob)
        return try withConnection { (connection) throws(LockboxError) in
            let parent = try primaryKey(&connection)
            var publicPart = inPublic
            var privatePart = inPrivate
            var handle: ESYS_TR = Constant.none
            let loaded = Self.tss2.Esys_Load(connection.esys, parent, Constant.password, Constant.none, Constant.none, &privatePart, &publicPart, &handle)
            if Self.isTransportFailure(loaded) { try check(loaded, "Esys_Load", &connection) }
            guard loaded == 0 else {
                throw LockboxError(
                    .authFailed, "This TPM cannot open the sealed secret: it was sealed by another TPM, or the TPM was cleared.")
            }
            // Not after a transport failure: `disconnect` has finalized the context by then.
            defer { if !connection.isClosed { _ = Self.tss2.Esys_FlushContext(connection.esys, handle) } }
            var authorization = Constant.password
            var session: ESYS_TR?
            if !pcrs.isEmpty {
                let policy = try policyDigest(pcrs: pcrs, trial: false, &connection)
                authorization = policy.session
                session = policy.session
            }
            defer { if let session, !connection.isClosed { _ = Self.tss2.Esys_FlushContext(connection.esys, session) } }
            var data: UnsafeMutablePointer<TPM2B_SENSITIVE_DATA>?
            let result = Self.tss2.Esys_Unseal(connection.esys, handle, authorization, Constant.none, Constant.none, &data)
            defer {
                if let data {
                    withUnsafeMutableBytes(of: &data.pointee) { sodiumStyleWipe($0) }
                    Self.tss2.Esys_Free(data)
                }
            }
            if Self.isTransportFailure(result) { try check(result, "Esys_Unseal", &connection) }
            guard result == 0, let data else {
                throw LockboxError(
                    .authFailed,
                    "The TPM refused to unseal: the PCRs \(pcrs.map(String.init).joined(separator: ",")) no longer have the values "
                        + "it was sealed to (the boot chain or firmware changed). Unlock with the passphrase and enroll the TPM again.")
            }
            let size = Int(data.pointee.size)
            return withUnsafeBytes(of: &data.pointee.buffer) { buffer in
                SecretBytes(copying: UnsafeRawBufferPointer(rebasing: buffer[0..<size]))
            }
        }
    }

    /// A sealed secret's parts: `count | PCR numbers | TPM2B_PUBLIC | TPM2B_PRIVATE`.
    private static func splitSealed(_ sealed: [UInt8]) throws(LockboxError) -> (pcrs: [Int], blob: [UInt8]) {
        guard let count = sealed.first, sealed.count > 1 + Int(count) else { throw LockboxError(.decode, "The TPM-sealed secret is damaged.") }
        let pcrs = sealed[1..<1 + Int(count)].map(Int.init)
        guard pcrs.allSatisfy({ $0 < 24 }) else { throw LockboxError(.decode, "The TPM-sealed secret is damaged.") }
        return (pcrs, Array(sealed[(1 + Int(count))...]))
    }

    /// Whether `blob` decodes as a key blob (the fuzzer's entry to the decoding of stored TPM
    /// blobs, which needs no TPM).
    package static func decodesKeyBlob(_ blob: [UInt8]) -> Bool {
        (try? unmarshal(blob)) != nil
    }

    /// Whether `sealed` decodes as a sealed secret (the fuzzer's entry).
    package static func decodesSealed(_ sealed: [UInt8]) -> Bool {
        guard let (_, blob) = try? splitSealed(sealed) else { return false }
        return (try? unmarshal(blob)) != nil
    }

    /// Closes this process's connection (it is made again on the next call). Without the
    /// kernel's resource manager (swtpm, /dev/tpm0) the TPM serves one connection at a time: a
    /// process that only unseals its device key lets others in at once.
    package func disconnect() {
        connection.withLock { slot in
            guard var current = slot else { return }
            for handle in current.loaded.values { _ = Self.tss2.Esys_FlushContext(current.esys, handle) }
            if let primary = current.primary { _ = Self.tss2.Esys_FlushContext(current.esys, primary) }
            disconnect(&current)
            slot = nil
        }
    }

    // MARK: Internals

    private func withConnection<T>(_ body: (inout Connection) throws(LockboxError) -> T) throws(LockboxError) -> T {
        try connection.withLock { (slot) throws(LockboxError) -> T in
            if slot == nil { slot = try connect() }
            var current = slot!
            defer { slot = current.isClosed ? nil : current }
            return try body(&current)
        }
    }

    private func connect() throws(LockboxError) -> Connection {
        try Self.loadLibrary()
        Self.shared.withLock { _ in
            // The tss2 libraries log every failure to standard error, which is the caller's (a
            // command's output, a service's journal): Lockbox reports failures as errors. Set
            // before the libraries first log, under the lock every connection takes.
            _ = setenv("TSS2_LOG", "all+none", 0)
        }
        var tcti: OpaquePointer?
        let loaded = Self.tss2.Tss2_TctiLdr_Initialize(device, &tcti)
        guard loaded == 0, let tcti else {
            throw LockboxError(
                .notAvailable,
                "The TPM at \(device) cannot be reached (\(Self.describe(loaded))). Check that it exists and that this user may use it.")
        }
        var esys: OpaquePointer?
        let initialized = Self.tss2.Esys_Initialize(&esys, tcti, nil)
        guard initialized == 0, let esys else {
            var owned: OpaquePointer? = tcti
            Self.tss2.Tss2_TctiLdr_Finalize(&owned)
            throw LockboxError(.notAvailable, "The TPM at \(device) cannot be used (\(Self.describe(initialized))).")
        }
        var connection = Connection(esys: esys, tcti: tcti)
        if !hasResourceManager { flushLeftovers(&connection) }
        return connection
    }

    /// Whether the kernel's resource manager stands between this process and the TPM (it
    /// swaps objects in and out and flushes a process's objects when it exits). Without it
    /// (swtpm, /dev/tpm0) the TPM serves one connection at a time and has three object slots.
    // (No `String.contains(_:)` here: with Foundation in sight it resolves to Foundation's, and
    // the static `lockbox`, which links this module, would then link CoreFoundation.)
    private var hasResourceManager: Bool { device.firstRange(of: "tpmrm") != nil }

    /// Without a resource manager, objects a killed process left loaded stay until flushed:
    /// this connection is the only one, so every transient object found at its start is such
    /// a leftover.
    private func flushLeftovers(_ connection: inout Connection) {
        var more: TPMI_YES_NO = 0
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        guard Self.tss2.Esys_GetCapability(connection.esys, Constant.none, Constant.none, Constant.none, Constant.capabilityHandles,
            Constant.firstTransient, 64, &more, &data) == 0, let data
        else { return }
        defer { Self.tss2.Esys_Free(data) }
        var handles = data.pointee.data.handles
        let count = min(Int(handles.count), MemoryLayout.size(ofValue: handles.handle) / MemoryLayout<TPM2_HANDLE>.size)
        withUnsafeBytes(of: &handles.handle) { raw in
            for handle in raw.bindMemory(to: TPM2_HANDLE.self).prefix(count) {
                var object: ESYS_TR = Constant.none
                if Self.tss2.Esys_TR_FromTPMPublic(connection.esys, handle, Constant.none, Constant.none, Constant.none, &object) == 0 {
                    _ = Self.tss2.Esys_FlushContext(connection.esys, object)
                }
            }
        }
    }

    /// Closes the connection after a transport failure; `withConnection` then drops it.
    private func disconnect(_ connection: inout Connection) {
        var esys: OpaquePointer? = connection.esys
        Self.tss2.Esys_Finalize(&esys)
        var tcti: OpaquePointer? = connection.tcti
        Self.tss2.Tss2_TctiLdr_Finalize(&tcti)
        connection.isClosed = true
    }

    private func check(_ result: TSS2_RC, _ operation: String, _ connection: inout Connection) throws(LockboxError) {
        guard result != 0 else { return }
        if Self.isTransportFailure(result) {
            disconnect(&connection)
            throw LockboxError(
                .notAvailable,
                "The TPM at \(device) stopped answering (\(operation): \(Self.describe(result))). Nothing was changed; try again once it is back.")
        }
        throw LockboxError(.io, "The TPM refused \(operation) (\(Self.describe(result))).")
    }

    /// Failures below the TPM itself: the TCTI (socket, device) or ESAPI's own I/O.
    /// `Esys_Create` of an object under `parent`: its public and private parts, copied out of
    /// the TPM library's buffers (which are freed here with everything else it returned).
    private func create(
        under parent: ESYS_TR, sensitive: inout TPM2B_SENSITIVE_CREATE, template: inout TPM2B_PUBLIC, _ what: String,
        _ connection: inout Connection
    ) throws(LockboxError) -> (TPM2B_PUBLIC, TPM2B_PRIVATE) {
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var outPrivate: UnsafeMutablePointer<TPM2B_PRIVATE>?
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: UnsafeMutablePointer<TPM2B_CREATION_DATA>?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var creationTicket: UnsafeMutablePointer<TPMT_TK_CREATION>?
        let result = Self.tss2.Esys_Create(
            connection.esys, parent, Constant.password, Constant.none, Constant.none, &sensitive, &template, &outsideInfo,
            &creationPCR, &outPrivate, &outPublic, &creationData, &creationHash, &creationTicket)
        defer {
            Self.tss2.Esys_Free(outPrivate)
            Self.tss2.Esys_Free(outPublic)
            Self.tss2.Esys_Free(creationData)
            Self.tss2.Esys_Free(creationHash)
            Self.tss2.Esys_Free(creationTicket)
        }
        try check(result, "Esys_Create", &connection)
        guard let outPrivate, let outPublic else { throw Self.failure("Esys_Create returned no \(what)") }
        return (outPublic.pointee, outPrivate.pointee)
    }

    private static func isTransportFailure(_ result: TSS2_RC) -> Bool {
        let layer = result >> 16
        // TSS2_TCTI_RC_LAYER (10), and ESAPI's I/O and try-again errors.
        return layer == 10 || result == 0x0007_000A || result == 0x0007_0009 || result == 0x0007_0015
    }

    private func primaryKey(_ connection: inout Connection) throws(LockboxError) -> ESYS_TR {
        if let primary = connection.primary { return primary }
        var sensitive = TPM2B_SENSITIVE_CREATE()
        var template = TPM2B_PUBLIC()
        template.publicArea.type = Constant.algorithmECC
        template.publicArea.nameAlg = Constant.algorithmSHA256
        template.publicArea.objectAttributes =
            Constant.fixedTPM | Constant.fixedParent | Constant.sensitiveDataOrigin | Constant.userWithAuth | Constant.noDA
            | Constant.restricted | Constant.decrypt
        template.publicArea.parameters.eccDetail.symmetric.algorithm = Constant.algorithmAES
        template.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 128
        template.publicArea.parameters.eccDetail.symmetric.mode.aes = Constant.algorithmCFB
        template.publicArea.parameters.eccDetail.scheme.scheme = Constant.algorithmNull
        template.publicArea.parameters.eccDetail.curveID = Constant.curveP256
        template.publicArea.parameters.eccDetail.kdf.scheme = Constant.algorithmNull
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var handle: ESYS_TR = Constant.none
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: UnsafeMutablePointer<TPM2B_CREATION_DATA>?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var creationTicket: UnsafeMutablePointer<TPMT_TK_CREATION>?
        let result = Self.tss2.Esys_CreatePrimary(
            connection.esys, Constant.owner, Constant.password, Constant.none, Constant.none, &sensitive, &template, &outsideInfo,
            &creationPCR, &handle, &outPublic, &creationData, &creationHash, &creationTicket)
        Self.tss2.Esys_Free(outPublic)
        Self.tss2.Esys_Free(creationData)
        Self.tss2.Esys_Free(creationHash)
        Self.tss2.Esys_Free(creationTicket)
        try check(result, "Esys_CreatePrimary", &connection)
        connection.primary = handle
        return handle
    }

    private func loadedKey(_ blob: [UInt8], _ connection: inout Connection) throws(LockboxError) -> ESYS_TR {
        if let handle = connection.loaded[blob] { return handle }
        let parent = try primaryKey(&connection)
        var (inPublic, inPrivate) = try Self.unmarshal(blob)
        var handle: ESYS_TR = Constant.none
        let result = Self.tss2.Esys_Load(connection.esys, parent, Constant.password, Constant.none, Constant.none, &inPrivate, &inPublic, &handle)
        if Self.isTransportFailure(result) { try check(result, "Esys_Load", &connection) }
        guard result == 0 else {
            throw LockboxError(
                .invalidKeyRef,
                "This TPM cannot load the key: it was made by another TPM, or this TPM was cleared since. "
                    + "A hardware key cannot move; delete it and make a new one here.")
        }
        // A few keys stay loaded: behind the resource manager it swaps them; without one the
        // TPM has three object slots, for the storage key, one key and a sealed object.
        if connection.loaded.count >= (hasResourceManager ? 8 : 1), let (oldBlob, oldHandle) = connection.loaded.first {
            _ = Self.tss2.Esys_FlushContext(connection.esys, oldHandle)
            connection.loaded.removeValue(forKey: oldBlob)
        }
        connection.loaded[blob] = handle
        return handle
    }

    /// A policy session (or trial session) that has run PolicyPCR over the current values of
    /// `pcrs` in the SHA-256 bank, and its digest.
    private func policyDigest(pcrs: [Int], trial: Bool, _ connection: inout Connection) throws(LockboxError) -> (
        session: ESYS_TR, digest: TPM2B_DIGEST
    ) {
        var symmetric = TPMT_SYM_DEF()
        symmetric.algorithm = Constant.algorithmNull
        var session: ESYS_TR = Constant.none
        let started = Self.tss2.Esys_StartAuthSession(
            connection.esys, Constant.none, Constant.none, Constant.none, Constant.none, Constant.none, nil,
            trial ? Constant.sessionTrial : Constant.sessionPolicy, &symmetric, Constant.algorithmSHA256, &session)
        try check(started, "Esys_StartAuthSession", &connection)
        var selection = TPML_PCR_SELECTION()
        selection.count = 1
        selection.pcrSelections.0.hash = Constant.algorithmSHA256
        selection.pcrSelections.0.sizeofSelect = 3
        withUnsafeMutableBytes(of: &selection.pcrSelections.0.pcrSelect) { bytes in
            for pcr in pcrs { bytes[pcr / 8] |= UInt8(1 << (pcr % 8)) }
        }
        var empty = TPM2B_DIGEST()
        let applied = Self.tss2.Esys_PolicyPCR(connection.esys, session, Constant.none, Constant.none, Constant.none, &empty, &selection)
        if applied != 0 { _ = Self.tss2.Esys_FlushContext(connection.esys, session) }
        try check(applied, "Esys_PolicyPCR", &connection)
        var digest: UnsafeMutablePointer<TPM2B_DIGEST>?
        let got = Self.tss2.Esys_PolicyGetDigest(connection.esys, session, Constant.none, Constant.none, Constant.none, &digest)
        defer { Self.tss2.Esys_Free(digest) }
        if got != 0 { _ = Self.tss2.Esys_FlushContext(connection.esys, session) }
        try check(got, "Esys_PolicyGetDigest", &connection)
        guard let digest else { throw Self.failure("Esys_PolicyGetDigest returned nothing") }
        return (session, digest.pointee)
    }

    private static func marshal(public publicPart: TPM2B_PUBLIC, private privatePart: TPM2B_PRIVATE) throws(LockboxError) -> [UInt8] {
        var publicPart = publicPart
        var privatePart = privatePart
        var buffer = [UInt8](repeating: 0, count: MemoryLayout<TPM2B_PUBLIC>.size + MemoryLayout<TPM2B_PRIVATE>.size)
        var offset = 0
        let first = Self.tss2.Tss2_MU_TPM2B_PUBLIC_Marshal(&publicPart, &buffer, buffer.count, &offset)
        let second = Self.tss2.Tss2_MU_TPM2B_PRIVATE_Marshal(&privatePart, &buffer, buffer.count, &offset)
        guard first == 0, second == 0 else { throw failure("cannot encode the TPM's key blobs") }
        return Array(buffer[..<offset])
    }

    private static func unmarshal(_ blob: [UInt8]) throws(LockboxError) -> (TPM2B_PUBLIC, TPM2B_PRIVATE) {
        try loadLibrary()
        var publicPart = TPM2B_PUBLIC()
        var privatePart = TPM2B_PRIVATE()
        var offset = 0
        guard Self.tss2.Tss2_MU_TPM2B_PUBLIC_Unmarshal(blob, blob.count, &offset, &publicPart) == 0,
            Self.tss2.Tss2_MU_TPM2B_PRIVATE_Unmarshal(blob, blob.count, &offset, &privatePart) == 0, offset == blob.count,
            // Only the one encoding the TPM made: a blob that encodes back to other bytes (an
            // empty public area, a size that disagrees with its contents) is not one.
            (try? marshal(public: publicPart, private: privatePart)) == blob
        else { throw LockboxError(.decode, "The TPM key blob is damaged.") }
        return (publicPart, privatePart)
    }

    private static func bytes(of parameter: TPM2B_ECC_PARAMETER) -> [UInt8] {
        var parameter = parameter
        let size = min(Int(parameter.size), MemoryLayout.size(ofValue: parameter.buffer))
        return withUnsafeBytes(of: &parameter.buffer) { Array($0[0..<size]) }
    }

    private static func copy<Buffer>(_ bytes: [UInt8], into buffer: inout Buffer) {
        withUnsafeMutableBytes(of: &buffer) { target in
            precondition(bytes.count <= target.count)
            target.copyBytes(from: bytes)
        }
    }

    private static func describe(_ result: TSS2_RC) -> String {
        guard case .success(let library) = library, let text = library.functions.Tss2_RC_Decode(result) else {
            return "TPM result 0x" + String(result, radix: 16)
        }
        return String(cString: text)
    }

    // MARK: The libraries

    /// The tss2 functions, opened with dlopen on first use (see CTss2Loader): programs that
    /// link this module load the TPM libraries only when they reach a TPM.
    private struct Library: @unchecked Sendable {
        // Function pointers into libraries that stay loaded for the rest of the process.
        let functions: lockbox_tss2
    }

    private static let library: Result<Library, LockboxError> = {
        var reason = [CChar](repeating: 0, count: 512)
        guard let table = lockbox_tss2_load(&reason, reason.count) else {
            let text = reason.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            return .failure(LockboxError(.notAvailable, "The TPM cannot be used here: \(text)."))
        }
        return .success(Library(functions: table.pointee))
    }()

    /// Loads the tss2 libraries; throws `notAvailable`, naming the missing library.
    private static func loadLibrary() throws(LockboxError) {
        _ = try library.get()
    }

    /// The loaded functions: only reached after ``loadLibrary()`` succeeded (a connection or a
    /// decoded blob exists).
    private static var tss2: lockbox_tss2 {
        guard case .success(let library) = library else { preconditionFailure("the tss2 libraries are loaded before use") }
        return library.functions
    }

    private static func failure(_ what: String) -> LockboxError {
        LockboxError(.io, "The TPM failed: \(what).")
    }
}

/// Zeroes memory a secret passed through (a plain loop the optimizer keeps: the buffer escapes).
private func sodiumStyleWipe(_ buffer: UnsafeMutableRawBufferPointer) {
    guard let base = buffer.baseAddress else { return }
    memset(base, 0, buffer.count)
    withExtendedLifetime(buffer) {}
}

/// TPM 2.0 constants (Part 2 of the specification; ESAPI's handles). The headers define them
/// as casts, which Swift does not import.
private enum Constant {
    static let algorithmAES: TPM2_ALG_ID = 0x0006
    static let algorithmKeyedHash: TPM2_ALG_ID = 0x0008
    static let algorithmSHA256: TPM2_ALG_ID = 0x000B
    static let algorithmNull: TPM2_ALG_ID = 0x0010
    static let algorithmECDSA: TPM2_ALG_ID = 0x0018
    static let algorithmECC: TPM2_ALG_ID = 0x0023
    static let algorithmCFB: TPM2_ALG_ID = 0x0043
    static let curveP256: TPM2_ECC_CURVE = 0x0003
    static let fixedTPM: TPMA_OBJECT = 0x0000_0002
    static let fixedParent: TPMA_OBJECT = 0x0000_0010
    static let sensitiveDataOrigin: TPMA_OBJECT = 0x0000_0020
    static let userWithAuth: TPMA_OBJECT = 0x0000_0040
    static let noDA: TPMA_OBJECT = 0x0000_0400
    static let restricted: TPMA_OBJECT = 0x0001_0000
    static let decrypt: TPMA_OBJECT = 0x0002_0000
    static let sign: TPMA_OBJECT = 0x0004_0000
    static let hashCheckTag: TPM2_ST = 0x8024
    static let nullHierarchy: TPMI_RH_HIERARCHY = 0x4000_0007
    static let sessionPolicy: TPM2_SE = 0x01
    static let sessionTrial: TPM2_SE = 0x03
    static let capabilityHandles: TPM2_CAP = 0x0000_0001
    static let firstTransient: UInt32 = 0x8000_0000
    static let owner: ESYS_TR = 0x101
    static let password: ESYS_TR = 0x0FF
    static let none: ESYS_TR = 0xFFF
}
