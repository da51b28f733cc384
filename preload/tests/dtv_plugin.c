/* A plugin with thread-local storage, for dtv.c: every dlopen of one of these gives the
 * process a new TLS module, and the first TLS access of each thread afterwards may make
 * glibc grow that thread's DTV with malloc/realloc, from inside __tls_get_addr. Built
 * once per plugin with -DPLUGIN_ID=<n>. */
__thread unsigned long plugin_counter;
__thread char plugin_buffer[256];

unsigned long plugin_touch(void)
{
	plugin_buffer[PLUGIN_ID % 256]++;
	return ++plugin_counter;
}
