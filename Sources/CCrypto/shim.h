/* OpenSSL's libcrypto, for what libsodium does not have: HMAC-SHA1 for one-time codes, and
   for the Secret Service's dh-ietf1024-sha256-aes128-cbc-pkcs7 sessions big-number modular
   exponentiation (the RFC 2409 group), AES-128-CBC with PKCS#7 padding and HMAC-SHA256
   (HKDF, libcrypto's own). Calls without variadics only. */
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
