// The one file added for Linux: on Apple platforms Foundation re-exports Security, so files that
// import only Foundation use the Keychain; on Linux this re-export does the same for the module.
#if os(Linux)
@_exported import Security
#endif
