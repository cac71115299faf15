// The tss2 ESAPI functions Lockbox calls, reached through dlopen instead of the link line: a
// process that never touches a TPM never maps libtss2-esys, its TCTI loader or libcrypto (which
// ESAPI needs), so the statically linked `lockbox` can read a TPM-sealed device key without
// paying for those libraries on every other start.
//
// The types come from Debian's libtss2-dev headers; only the functions are taken at run time,
// from the libraries' versioned names (libtss2-esys.so.0 ...), which is their ABI contract.
#ifndef LOCKBOX_TSS2_LOADER_H
#define LOCKBOX_TSS2_LOADER_H

#include <stddef.h>
#include <tss2/tss2_esys.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>
#include <tss2/tss2_tctildr.h>

#define LOCKBOX_TSS2_FUNCTION(name) __typeof__(name) *_Nonnull name

// Every field is a function pointer, resolved by lockbox_tss2_load (see the table in the .c).
struct lockbox_tss2 {
    LOCKBOX_TSS2_FUNCTION(Tss2_TctiLdr_Initialize);
    LOCKBOX_TSS2_FUNCTION(Tss2_TctiLdr_Finalize);
    LOCKBOX_TSS2_FUNCTION(Esys_Initialize);
    LOCKBOX_TSS2_FUNCTION(Esys_Finalize);
    LOCKBOX_TSS2_FUNCTION(Esys_Free);
    LOCKBOX_TSS2_FUNCTION(Esys_CreatePrimary);
    LOCKBOX_TSS2_FUNCTION(Esys_Create);
    LOCKBOX_TSS2_FUNCTION(Esys_Load);
    LOCKBOX_TSS2_FUNCTION(Esys_FlushContext);
    LOCKBOX_TSS2_FUNCTION(Esys_Sign);
    LOCKBOX_TSS2_FUNCTION(Esys_Unseal);
    LOCKBOX_TSS2_FUNCTION(Esys_PCR_Extend);
    LOCKBOX_TSS2_FUNCTION(Esys_StartAuthSession);
    LOCKBOX_TSS2_FUNCTION(Esys_PolicyPCR);
    LOCKBOX_TSS2_FUNCTION(Esys_PolicyGetDigest);
    LOCKBOX_TSS2_FUNCTION(Esys_GetCapability);
    LOCKBOX_TSS2_FUNCTION(Esys_TR_FromTPMPublic);
    LOCKBOX_TSS2_FUNCTION(Tss2_MU_TPM2B_PUBLIC_Marshal);
    LOCKBOX_TSS2_FUNCTION(Tss2_MU_TPM2B_PUBLIC_Unmarshal);
    LOCKBOX_TSS2_FUNCTION(Tss2_MU_TPM2B_PRIVATE_Marshal);
    LOCKBOX_TSS2_FUNCTION(Tss2_MU_TPM2B_PRIVATE_Unmarshal);
    LOCKBOX_TSS2_FUNCTION(Tss2_RC_Decode);
};

#undef LOCKBOX_TSS2_FUNCTION

// The functions, loaded on the first call and kept for the rest of the process; NULL when a
// library or a function is missing, with the reason (naming the library) in `error`.
const struct lockbox_tss2 *_Nullable lockbox_tss2_load(char *_Nonnull error, size_t size);

#endif
