/* OpenSSL's libcrypto: HMAC-SHA1 for one-time codes (libsodium has no SHA-1). One call,
   no variadics: HMAC(3) with EVP_sha1(). */
#include <openssl/evp.h>
#include <openssl/hmac.h>
