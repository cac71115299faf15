extension ItemAttributes {
    /// Version of the attribute encoding; decoding refuses versions it does not know.
    private static let encodingVersion: UInt8 = 1

    /// The attributes as bytes, for sealing: the version, then one field per row of
    /// ``fields``, in the table's order.
    package func encoded() -> [UInt8] {
        var encoder = FieldEncoder()
        // The version byte read in place (the same field as `bytes([encodingVersion])`, without
        // an array: this runs for every item written).
        withUnsafeBytes(of: Self.encodingVersion) { encoder.bytes(inPlace: $0) }
        for field in Self.fields {
            field.encode(self, into: &encoder)
        }
        return encoder.bytes
    }

    /// Decodes ``encoded()``'s output.
    package init(decoding bytes: [UInt8]) throws(FieldDecoder.Malformed) {
        var decoder = FieldDecoder(bytes)
        guard try decoder.bytes() == [Self.encodingVersion] else { throw FieldDecoder.Malformed() }
        self.init()
        for field in Self.fields {
            try field.decode(from: &decoder, into: &self)
        }
        guard decoder.isAtEnd else { throw FieldDecoder.Malformed() }
    }
}
