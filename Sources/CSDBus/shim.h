/* sd-bus from libsystemd: the session bus for the Secret Service. Only calls without
   format strings are used from Swift (the _basic, _array and container calls); the vtable
   macros are not needed: one fallback handler per subtree answers every message. */
#include <systemd/sd-bus.h>
