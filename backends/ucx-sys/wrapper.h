#include <stdio.h>
#include <ucp/api/ucp.h>
