#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/rand.h>

/* EVP_PKEY_KEYPAIR and EVP_PKEY_PUBLIC_KEY are macros built from other macros, which Swift does
   not import. */
static const int lockbox_evp_pkey_keypair = EVP_PKEY_KEYPAIR;
static const int lockbox_evp_pkey_public_key = EVP_PKEY_PUBLIC_KEY;
static const int lockbox_evp_ctrl_gcm_get_tag = EVP_CTRL_GCM_GET_TAG;
static const int lockbox_evp_ctrl_gcm_set_tag = EVP_CTRL_GCM_SET_TAG;
static const int lockbox_evp_ctrl_gcm_set_ivlen = EVP_CTRL_GCM_SET_IVLEN;
