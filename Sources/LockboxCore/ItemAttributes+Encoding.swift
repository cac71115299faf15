import struct Foundation.Data
import struct Foundation.Date

extension ItemAttributes {
    /// Version of the attribute encoding; decoding refuses versions it does not know.
    private static let encodingVersion: UInt8 = 1

    /// The attributes as bytes, for sealing. Field order is fixed by this function.
    package func encoded() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.bytes([Self.encodingVersion])
        encoder.string(label)
        encoder.string(comment)
        encoder.string(itemDescription)
        encoder.bytes(generic.map(Array.init))
        encoder.double(creationDate?.timeIntervalSince1970)
        encoder.double(modificationDate?.timeIntervalSince1970)
        encoder.string(accessGroup)
        encoder.integer(synchronizable.map { $0 ? 1 : 0 })
        encoder.string(accessibility?.rawValue)
        encoder.string(service)
        encoder.string(account)
        encoder.string(server)
        encoder.string(`protocol`?.rawValue)
        encoder.integer(port)
        encoder.string(path)
        encoder.string(securityDomain)
        encoder.string(authenticationType?.rawValue)
        encoder.string(keyClass?.rawValue)
        encoder.string(keyType?.rawValue)
        encoder.integer(keySizeInBits)
        encoder.integer(effectiveKeySize)
        encoder.bytes(applicationTag.map(Array.init))
        encoder.bytes(applicationLabel.map(Array.init))
        encoder.integer(certificateType)
        encoder.bytes(subject.map(Array.init))
        encoder.bytes(issuer.map(Array.init))
        encoder.bytes(serialNumber.map(Array.init))
        return encoder.bytes
    }

    /// Decodes ``encoded()``'s output.
    package init(decoding bytes: [UInt8]) throws(FieldDecoder.Malformed) {
        var decoder = FieldDecoder(bytes)
        guard try decoder.bytes() == [Self.encodingVersion] else { throw FieldDecoder.Malformed() }
        self.init()
        label = try decoder.string()
        comment = try decoder.string()
        itemDescription = try decoder.string()
        generic = try decoder.bytes().map { Data($0) }
        creationDate = try decoder.double().map { Date(timeIntervalSince1970: $0) }
        modificationDate = try decoder.double().map { Date(timeIntervalSince1970: $0) }
        accessGroup = try decoder.string()
        synchronizable = try decoder.integer().map { $0 != 0 }
        if let raw = try decoder.string() {
            guard let value = Accessibility(rawValue: raw) else { throw FieldDecoder.Malformed() }
            accessibility = value
        }
        service = try decoder.string()
        account = try decoder.string()
        server = try decoder.string()
        `protocol` = try decoder.string().map(InternetProtocol.init(rawValue:))
        port = try decoder.integer()
        path = try decoder.string()
        securityDomain = try decoder.string()
        authenticationType = try decoder.string().map(AuthenticationType.init(rawValue:))
        if let raw = try decoder.string() {
            guard let value = KeyClass(rawValue: raw) else { throw FieldDecoder.Malformed() }
            keyClass = value
        }
        keyType = try decoder.string().map(KeyType.init(rawValue:))
        keySizeInBits = try decoder.integer()
        effectiveKeySize = try decoder.integer()
        applicationTag = try decoder.bytes().map { Data($0) }
        applicationLabel = try decoder.bytes().map { Data($0) }
        certificateType = try decoder.integer()
        subject = try decoder.bytes().map { Data($0) }
        issuer = try decoder.bytes().map { Data($0) }
        serialNumber = try decoder.bytes().map { Data($0) }
        guard decoder.isAtEnd else { throw FieldDecoder.Malformed() }
    }
}
