// `import Security` on Linux: Apple's SecItem and SecKey API over Lockbox, and Foundation, as
// the framework brings them on Apple platforms.
@_exported import KeychainCompatibility
